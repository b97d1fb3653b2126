#!/usr/bin/env bash
# Red team: t_rt_device_squat.sh with root's Go API client, whose peer check reads
# /proc/net/tcp{,6}, which does not show a socket's bound device. Before: it trusted nobody's
# listener bound to a device that loopback connections never come in on, and sent nobody its
# HELLO and bytes where TCP is refused. Now, without a table that shows devices, it trusts no
# rendezvous of another uid (go/trust.go, tableShowsDevices).
HERE=$(cd "$(dirname "$0")" && pwd)
GOPEER=$(mktemp /tmp/colo-peer.XXXXXX)
(cd "$HERE/../../go" && go build -o "$GOPEER" ./cmd/colo-peer) || { echo "FAIL go build colo-peer"; exit 1; }
chmod 755 "$GOPEER"
cd "$HERE" && CLIENT_NAME=Go CLIENT="$GOPEER client" bash -c 'CLIENT=($CLIENT); export CLIENT_NAME; source "'"$HERE"'/t_rt_device_squat.sh"'
rc=$?
rm -f "$GOPEER"
exit $rc
