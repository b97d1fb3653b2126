#!/usr/bin/env bash
# Red team: t_rt_device_squat.sh with root's Go API client. Before: its peer check read
# /proc/net/tcp{,6}, which does not show a socket's bound device, and it trusted nobody's
# listener bound to a device that loopback connections never come in on, sending nobody its
# HELLO and bytes where TCP is refused. Now it reads sock_diag, which shows the device, and
# trusts only listeners the kernel says are bound to none (go/trust.go, allUnbound).
HERE=$(cd "$(dirname "$0")" && pwd)
GOPEER=$(mktemp /tmp/colo-peer.XXXXXX)
(cd "$HERE/../../go" && go build -o "$GOPEER" ./cmd/colo-peer) || { echo "FAIL go build colo-peer"; exit 1; }
chmod 755 "$GOPEER"
cd "$HERE" && CLIENT_NAME=Go CLIENT="$GOPEER client" bash -c 'CLIENT=($CLIENT); export CLIENT_NAME; source "'"$HERE"'/t_rt_device_squat.sh"'
rc=$?
rm -f "$GOPEER"
exit $rc
