# tests/netns 14, sourced by run.sh (its namespaces, directory, environment and helpers).
# 14. The connect path of `colo run` to another namespace (spec/WIRE.md section 11, step 3),
# with python servers in B under colo run (nbprobe.py; DELAY seconds before each accept):
# (a) a non-blocking connect returns EINPROGRESS, POLLOUT comes, SO_ERROR is 0 and 1 MiB each way
# is intact, on shared memory (client-first and server-first); (b) one to a port where nothing
# listens returns EINPROGRESS, then SO_ERROR is ECONNREFUSED; (c) a server that accepts 1.5 s
# late: the client's connect succeeds, blocking or not, and the bytes are intact over plain TCP
# (the client stopped waiting for the answer after COLO_CARRIER_TIMEOUT_MS; the server declines
# the PROPOSAL it finds the client's bytes behind); (d) the same with a server that speaks first;
# (e) a late server's banner read through two copies of the socket (a dup) arrives whole: the
# copy that did not take the answer off the stream knows it was taken.
NB=(python3 "$HERE/nbprobe.py")
SENV=(env COLO_LOG=info COLO_NETNS_DIR="$DIR" COLO_NETNS_CLIENTS=10.231.0.0/16)
NBS=()
for spec in 7301:0:echo 7302:0:banner 7303:1.5:echo 7304:1.5:banner 7305:0.3:echo 7306:1.5:magic; do
    IFS=: read -r port delay mode <<<"$spec"
    ip netns exec "$NS_B" "${SENV[@]}" timeout 200 "$COLO" run -- "${NB[@]}" serve "$port" "$delay" "$mode" >"$WORK/nb$port.log" 2>&1 &
    PIDS+=($!)
    NBS+=($!)
done
for i in $(seq 100); do
    [ "$(ls "$DIR"/colo-*-730[1-6].live 2>/dev/null | wc -l)" = 6 ] && break
    sleep 0.1
done
nb_a() { # LOG ARGS...: nbprobe.py in A under colo run, its log to LOG
    local log=$1; shift
    ip netns exec "$NS_A" "${CENV[@]}" timeout 60 "$COLO" run -- "${NB[@]}" "$@" 2>"$log"
}
for spec in 7301:echo 7302:banner; do
    IFS=: read -r port mode <<<"$spec"
    r=$(nb_a "$WORK/nba$port.err" nbclient $IP_B "$port" "$mode")
    if [ "$r" = "EINPROGRESS 0 INTACT" ] && grep -q "connect $IP_B:$port: accelerated" "$WORK/nba$port.err"; then
        ok "14a non-blocking connect across namespaces ($mode): EINPROGRESS, POLLOUT, SO_ERROR 0, 1 MiB each way intact, accelerated"
    else
        bad "14a non-blocking connect ($mode): '$r'; $(grep -h "connect $IP_B" "$WORK/nba$port.err" | tail -3)"
    fi
    r=$(nb_a "$WORK/nbaio$port.err" aioclient $IP_B "$port" "$mode")
    if [ "$r" = "CONNECTED INTACT" ] && grep -q "connect $IP_B:$port: accelerated" "$WORK/nbaio$port.err"; then
        ok "14a python asyncio across namespaces ($mode): 1 MiB each way intact, accelerated"
    else
        bad "14a python asyncio ($mode): '$r'; $(grep -h "connect $IP_B" "$WORK/nbaio$port.err" | tail -3)"
    fi
done
# poll without waiting, with a server that accepts 0.3 s late (the client waits up to 3 s for
# its answer): nothing reported until decided, then on shared memory.
r=$(ip netns exec "$NS_A" "${CENV[@]}" COLO_CARRIER_TIMEOUT_MS=3000 timeout 60 "$COLO" run -- "${NB[@]}" pollzero $IP_B 7305 echo 2>"$WORK/nba7305.err")
if [ "$r" = "EINPROGRESS NOTYET 0 INTACT" ] && grep -q "connect $IP_B:7305: accelerated" "$WORK/nba7305.err"; then
    ok "14a poll without waiting while the answer is on its way: nothing reported, then POLLOUT, 1 MiB each way intact, accelerated"
else
    bad "14a poll without waiting: '$r' (want 'EINPROGRESS NOTYET 0 INTACT'); $(grep -h "connect $IP_B" "$WORK/nba7305.err" | tail -3)"
fi
r=$(ip netns exec "$NS_A" env COLO_LOG=info COLO_NETNS_PEERS=$IP_B:7399=$DIR timeout 60 "$COLO" run -- "${NB[@]}" nbclient $IP_B 7399 echo 2>"$WORK/nba7399.err")
if [ "$r" = "EINPROGRESS ECONNREFUSED" ]; then
    ok "14b non-blocking connect to a closed port across namespaces: EINPROGRESS, then SO_ERROR ECONNREFUSED"
else
    bad "14b refused: '$r' (want 'EINPROGRESS ECONNREFUSED'); $(tail -2 "$WORK/nba7399.err")"
fi
for spec in 7303:echo:client:CONNECTED 7303:echo:nbclient:"EINPROGRESS 0" 7303:echo:aioclient:CONNECTED \
    7304:banner:client:CONNECTED 7304:banner:nbclient:"EINPROGRESS 0" 7304:banner:aioclient:CONNECTED; do
    IFS=: read -r port mode how want <<<"$spec"
    log=$WORK/nba$port$how.err
    r=$(nb_a "$log" $how $IP_B "$port" "$mode")
    if [ "$r" = "$want INTACT" ] && grep -q "connect $IP_B:$port: other namespace: no answer within" "$log" &&
        ! grep -q "connect $IP_B:$port: accelerated" "$log"; then
        ok "14c server accepting 1.5 s late ($mode, $how): connect succeeds, bytes intact over plain TCP"
    else
        bad "14c late accept ($mode, $how): '$r' (want '$want INTACT'); $(grep -h "connect $IP_B" "$log" | tail -3)"
    fi
done
r=$(nb_a "$WORK/nba7306.err" dupclient $IP_B 7306)
if [ "$r" = "CONNECTED INTACT" ]; then
    ok "14e a late server's banner read through a dup and the socket: intact (the answer taken once)"
else
    bad "14e late banner through a dup: '$r' (want 'CONNECTED INTACT'); $(grep -h "connect $IP_B" "$WORK/nba7306.err" | tail -3)"
fi
if grep -q "declined: the client went on without waiting" "$WORK/nb7303.log"; then
    ok "14c the late server declined the PROPOSAL the client's bytes followed"
else
    bad "14c the late server: $(grep -h "accept" "$WORK/nb7303.log" | tail -3)"
fi
kill "${NBS[@]}" 2>/dev/null  # timeout passes the TERM on to the server
wait "${NBS[@]}" 2>/dev/null
