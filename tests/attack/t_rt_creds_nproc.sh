#!/usr/bin/env bash
# Red team: a process under colo run that drops its privileges to nobody's uid while a thread
# sleeps in a read of an accelerated connection, when nobody holds as many processes as its
# RLIMIT_NPROC allows (modelled by a limit of 0): the shim ends its hang-up watcher's thread
# before the set*id call and cannot start another after it. The watcher woke the sleeper once
# and let it go, but the sleeper had chosen its futex sleep untimed for the whole read, slept
# again with nothing watching its control socket, and the peer's death never ended the read
# (c/creds_nproc.c; its alarm fired). Now a sleeper sleeps untimed only while the watcher
# watches its connection.
source "$(dirname "$0")/lib.sh"
gcc -O2 -pthread -o "$WORK/creds_nproc" "$HERE/c/creds_nproc.c" || { bad "gcc"; finish; }
COLO_LOG=info timeout 30 $COLORUN "$WORK/creds_nproc" >"$WORK/out" 2>&1
rc=$?
sed 's/^/    /' "$WORK/out"
check "the connection was accelerated" grep -q "accept .*: accelerated" "$WORK/out"
check "the peer's death ended the read after a privilege drop with no thread to be had (exit $rc)" test "$rc" = 0
finish
