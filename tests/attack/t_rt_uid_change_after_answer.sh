#!/usr/bin/env bash
# Red team: a server that answered a client as root and changes uid afterwards must not hand
# the connection to its new user. Root's server (python under colo run,
# py/dropped_late_server.py) accepts root's client's connection as root, then drops to nobody
# and asks to be dumpable again (a privilege-separated server that drops per connection, and
# wants core dumps as nginx's workers do). Dumpable, it would be nobody's to write through
# /proc/PID/mem: py/dropped_late_thief.py writes the connection's words there, claims a whole
# ring of holes toward root's client and FIN, and kills the server, and the client, which judged
# the server by its answer's SCM_CREDENTIALS (root) and reads through its mapping, allocated
# the 8 MiB of holes, charged to it while it held the connection (RssShmem 0 -> 8 MiB). The
# shim now refuses `prctl(PR_SET_DUMPABLE, 1)` (EPERM) to a process whose uid changed since its
# image started while it holds a connection: the kernel made it undumpable at the change, and
# it stays so; nobody cannot read its maps. Not covered: a Go or Rust API program (no shim), a
# program dumpable through the suid_dumpable sysctl, and the mirror case (a client that
# connects as root and then serves another user its end) outside the shim.
# Run: bash tests/attack/t_rt_uid_change_after_answer.sh (as root).
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$HERE/../.." && pwd); TARGET=${CARGO_TARGET_DIR:-$ROOT/rust/target}; COLORUN="$TARGET/release/examples/colo-run --"
cp "$HERE/py/dropped_late_server.py" "$HERE/py/dropped_late_thief.py" "$HERE/colo_attack.py" "$WORK/" && chmod 644 "$WORK"/*.py
attack() { # LABEL CLIENT... (@P: the port)
  local label=$1 out=$WORK/$1 P; shift
  P=$(free_port)
  COLO_LOG=info timeout 60 $COLORUN /usr/bin/python3 "$WORK/dropped_late_server.py" "$P" 15 >"$out.server" 2>&1 & local srv=$!
  for _ in $(seq 100); do grep -qs LISTENING "$out.server" && break; sleep 0.05; done
  COLO_LOG=info timeout 40 "${@//@P/$P}" >"$out.client" 2>&1 & local cli=$!
  for _ in $(seq 100); do grep -qs ACCEPTED "$out.server" && break; sleep 0.1; done
  local spid; spid=$(awk '/^ACCEPTED/ {print $2}' "$out.server")
  # The client process itself (under timeout, and colo-run's exec).
  local cpid=$cli; for _ in 1 2 3; do local c; c=$(pgrep -P "$cpid" | head -1); [ -n "$c" ] && cpid=$c; done
  shmem() { awk '/^RssShmem/ {print int($2 / 1024)}' "/proc/$cpid/status" 2>/dev/null; }
  local before; before=$(shmem)
  as_nobody timeout 40 /usr/bin/python3 "$WORK/dropped_late_thief.py" "${spid:-0}" >"$out.thief" 2>&1
  for _ in $(seq 200); do grep -qis 'CLIENT READ' "$out.client" && break; sleep 0.1; done
  local during; during=$(shmem)
  kill "$srv" 2>/dev/null; wait "$cli" "$srv" 2>/dev/null
  sed 's/^/    /' "$out.thief" "$out.client"
  check "$label: root's server accepted the connection accelerated" grep -q 'accept .*accelerated' "$out.server"
  check "$label: root's client holds none of the holes of a server that became nobody's after answering (its RssShmem ${before:-?} -> ${during:-?} MiB)" \
    test "${during:-99}" -le $(( ${before:-0} + 1 ))
}
attack shim $COLORUN /usr/bin/python3 -c "
import socket, time
s = socket.create_connection(('127.0.0.1', @P)); s.sendall(b'x'); n = 0
s.settimeout(30)
while True:
    b = s.recv(1 << 20)
    if not b: break
    n += len(b)
print('CLIENT READ', n, flush=True); time.sleep(3); s.close()"
finish
