#!/usr/bin/env bash
# Red team: a recycled segment must not let a client of another uid be read through the
# server's mapping. A side reads a peer of another user's ring with pread of the segment's
# memfd (colo::Segment::read_through_memfd), so that bytes the peer claims and never writes
# (holes) allocate nothing of ours; a same-user connection closes the memfd at set-up, so a
# segment it parks has none. Root's Rust API server (the peer example, echo) opted in to DIRECT
# from any uid (COLO_DIRECT_ANY_UID=1); root's client process (py/recycle_uid.py) connects
# DIRECT, closes cleanly (the server parks the segment), drops to nobody and recycles the
# segment (same process, the ticket it read). Before, the Rust listener took the RECYCLE HELLO
# (Go's refuses a recycling peer of another uid) and read nobody's ring through its mapping:
# a ring of holes nobody claimed stayed allocated, charged to root's server while connected
# (4 MiB). Now it refuses one from another uid whose parked segment has no memfd to read it through
# (REJECT(BAD_SEGMENT), as Go; the client dials TCP).
source "$(dirname "$0")/lib.sh"
cp "$HERE/py/recycle_uid.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
P=$(free_port)
COLO_DIRECT_ANY_UID=1 COLO_LOG=info timeout 60 "$PEER" server "127.0.0.1:$P" stream >"$WORK/server.out" 2>&1 & srv=$!
for _ in $(seq 100); do [ -n "$(ss -Hlxn "src @colo/1/127.0.0.1:$P" 2>/dev/null)" ] && break; sleep 0.05; done
timeout 40 /usr/bin/python3 "$WORK/recycle_uid.py" "$P" >"$WORK/client.out" 2>&1
kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null
sed 's/^/    /' "$WORK/client.out"
grep -i 'recycl\|refus' "$WORK/server.out" | head -3 | sed 's/^/    server: /'
check "the first connection was served and its segment parked" grep -q "^PARKED [23] .*echoed b'hi'" "$WORK/client.out"
check "the process recycled as nobody" grep -q '^RECYCLE .* uid 65534' "$WORK/client.out"
alloc=$(awk '/^ALLOCATED/ {print $2}' "$WORK/client.out")
check "nobody's recycled ring was refused or read without allocating its holes (${alloc:-refused})" \
  sh -c "grep -q '^RECYCLE REJECT' '$WORK/client.out' || [ '${alloc:-99}' -le 1 ]"
finish
