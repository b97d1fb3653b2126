#!/usr/bin/env bash
# Issue 21 finding 1: a fake offer service for a daemonized server. nobody pre-binds the names
# the shim once asked when the process that listened was gone (colo/1/shim/adopted/<pid>, for a
# range of upcoming pids) and answers with a genuine offer of its own client's; root then starts
# nginx (daemon on: the process that listens exits; 2 workers, running as root, serving a file
# only root can read) under colo run. Root's clients must get the real page over shared memory;
# the attacker must get no request and no page. (Before the fix: the workers asked the attacker,
# accelerated its segment, and the attacker's curl read the page.)
source "$(dirname "$0")/lib.sh"
command -v nginx >/dev/null || { echo "FAIL nginx is not installed (tests/apps/packages.txt)"; exit 1; }
[ -e "$SHIM" ] || { echo "FAIL $SHIM not built (run tests/attack/run.sh)"; exit 1; }

N=$(free_port)
NG=$WORK/ngx; mkdir -p "$NG/www" "$NG/logs"; chmod 700 "$NG"
SECRET="root-only-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
echo "$SECRET" > "$NG/www/secret.txt"; chmod 600 "$NG/www/secret.txt"
cat > "$NG/nginx.conf" <<NGX
user root root;
worker_processes 2;
daemon on;
pid $NG/nginx.pid;
error_log $NG/logs/error.log info;
events { worker_connections 256; }
http { access_log off; server { listen 127.0.0.1:$N; root $NG/www; } }
NGX

ATK=$WORK/attacker; mkdir -p "$ATK"; chown nobody:nogroup "$ATK"
( ulimit -n 8192; exec setpriv --reuid=nobody --regid=nogroup --clear-groups env ATTACK_SECONDS=60 \
    /usr/bin/python3 "$HERE/py/shim_fake_service.py" "$ATK" 3000 /secret.txt $COLORUN ) >"$ATK/ready" 2>"$ATK/err" &
PIDS+=($!)
for _ in $(seq 200); do grep -qs READY "$ATK/ready" && break; sleep 0.05; done
check "the attacker bound the old adopted names for 3000 upcoming pids" grep -q "BOUND 3000 names" "$ATK/attacker.log"
read -r _ FIRST LAST < "$ATK/ready"

stop_nginx() { [ -s "$NG/nginx.pid" ] && kill "$(cat "$NG/nginx.pid")" 2>/dev/null; sleep 0.3; }
trap 'stop_nginx; cleanup' EXIT
COLO_LOG=info $COLORUN nginx -c "$NG/nginx.conf" -p "$NG" >"$NG/start.log" 2>&1 &
MASTER=$!
wait $MASTER
wait_port "$N"
if [ "$MASTER" -ge "$FIRST" ] && [ "$MASTER" -le "$LAST" ]; then
  echo "     (the process that listened, pid $MASTER, had its old adopted name squatted)"
else
  echo "     (note: pid $MASTER fell outside the squatted range $FIRST..$LAST)"
fi
check "nginx daemonized (the process that listened exited)" sh -c "! kill -0 $MASTER 2>/dev/null"

ok_runs=0 acc_runs=0
for i in 1 2 3 4 5 6; do
  got=$(timeout 10 env COLO_LOG=info COLO_SHORT_LIVED=accelerate $COLORUN curl -s -m 5 "http://127.0.0.1:$N/secret.txt" 2>"$WORK/client$i.err")
  [ "$got" = "$SECRET" ] && ok_runs=$((ok_runs + 1))
  grep -q ": accelerated (shared memory)" "$WORK/client$i.err" && acc_runs=$((acc_runs + 1))
done
check "root's client got the real page each time ($ok_runs of 6)" test "$ok_runs" = 6
check "... over shared memory ($acc_runs of 6)" test "$acc_runs" = 6
check "the daemon took the service over (no name involved)" grep -q "the process that listened is gone: serving colo offers" "$NG/logs/error.log"
sleep 0.5
check "the attacker's names were never asked" sh -c "! grep -q REQUEST '$ATK/attacker.log'"
check "the attacker read no page" sh -c "! grep -qs '$SECRET' '$ATK/stolen'"
check "no client of the attacker's was accelerated by nginx" sh -c "! grep -q ANSWERED '$ATK/attacker.log'"
got=$(timeout 10 curl -s -m 5 "http://127.0.0.1:$N/secret.txt")
check "nginx still serves plain TCP clients" test "$got" = "$SECRET"
finish
