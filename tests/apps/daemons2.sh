#!/usr/bin/env bash
# More unmodified programs, server and client both under `colo run`: iperf3 (bulk both ways,
# parallel streams, and a server that closes its listener and listens again after every test),
# a redis replica syncing a large dataset from its master (a forked child makes the RDB), python's
# http.server, beanstalkd, git daemon (a clone over git://), dnsmasq over TCP, tinyproxy, ncat
# both ways, stunnel, vsftpd (passive and active), gunicorn's and php-fpm's synchronous workers (php-fpm
# behind nginx) under wrk. Each gives the bytes it gives over plain TCP (checksums, digests), its
# connections are accelerated (the shim's log lines), and the servers' descriptors come back.
# Every step has a timeout.
source "$(dirname "$0")/common.sh"
[ -n "${COLO_APPS_BUILT:-}" ] || build
FAIL=0
acc() { grep -c 'accelerated (shared memory)' "$1"; }
# listening PORT: the port is listened on (seen without connecting: iperf3 and ncat -l would take a
# probe connection for their client).
# no_full_wait LOG: no connection in LOG waited out the carrier timeout (500 ms) for an answer
# (a connection given up on sooner, its server not accepting, says how long it waited).
no_full_wait() { awk '/no answer within/ { for (i = 1; i < NF; i++) if ($i == "within" && $(i + 1) + 0 >= 400) bad = 1 } END { exit bad }' "$1"; }
listening() { for _ in $(seq 200); do ss -Hltn "sport = :$1" | grep -q . && return 0; sleep 0.02; done; echo "port $1 never listened"; return 1; }
head -c 10000000 /dev/urandom >"$WORK/10m.bin"

if need iperf3; then
  I=$(free_port)
  # iperf3 -s closes its listener and listens again on the same address after each test: every
  # test's connections are accelerated only if each new listener gets the rendezvous back.
  COLO_LOG=info timeout 120 $COLORUN iperf3 -s -p "$I" >"$WORK/iperf3.log" 2>&1 & IS=$!; PIDS+=($IS)
  listening "$I"; IS=$(pgrep -P "$IS" -x iperf3)
  n=0
  # Each mode with its connection count: the control connection and the data streams.
  for m in ":2" "-R:2" "-P 4:5" "--bidir:3" "-P 4 -R:5"; do
    mode=${m%:*} conns=${m##*:}
    # The next test may only start once the server listens again (as over TCP).
    for _ in $(seq 100); do [ "$(grep -c "serving colo offers" "$WORK/iperf3.log")" -gt "$n" ] && break; sleep 0.02; done
    n=$((n + 1))
    out=$WORK/iperf3-$n.json
    timeout 30 env COLO_LOG=info $COLORUN iperf3 -c 127.0.0.1 -p "$I" -t 1 -J $mode >"$out" 2>"$WORK/iperf3-$n.err"
    # iperf3 checks no content, and its two counts differ over TCP too (bytes in flight when
    # each side took its count): each direction carried data, and no more arrived than was sent.
    check "iperf3 ${mode:-(send)}: the test ran, data arrived each way it was sent" python3 -c "
import json, sys
j = json.load(open('$out'))
e = j['end']
pairs = [(e['sum_sent']['bytes'], e['sum_received']['bytes'])]
if 'sum_sent_bidir_reverse' in e: pairs.append((e['sum_sent_bidir_reverse']['bytes'], e['sum_received_bidir_reverse']['bytes']))
sys.exit(0 if all(0 < r <= s for s, r in pairs) else 1)"
    check "... its $conns connections accelerated" test "$(acc "$WORK/iperf3-$n.err")" -eq "$conns"
    # The baseline after the first test: the shim makes a few descriptors of its own at the first
    # accelerated connection, for the life of the process.
    [ $n = 1 ] && ib=$(fds "$IS")
  done
  check "... the server listened again $n times, each serving colo offers" sh -c "! grep -q 'held by another process' '$WORK/iperf3.log'"
  check "... its descriptors come back to $ib" fds_back "$IS" "$ib"
fi

if need redis-server; then
  M=$(free_port) R=$(free_port); mkdir -p "$WORK/rm" "$WORK/rr"
  COLO_LOG=info timeout 120 $COLORUN redis-server --port "$M" --save '' --appendonly no --dir "$WORK/rm" \
    --enable-debug-command local --repl-diskless-sync-delay 0 >"$WORK/rmaster.log" 2>&1 & PIDS+=($!)
  wait_port "$M"
  timeout 30 redis-cli -p "$M" debug populate 200000 k 200 >/dev/null
  # Disk-based, then diskless (the forked child writes the RDB into a pipe the master sends on).
  for diskless in no yes; do
    timeout 10 redis-cli -p "$M" config set repl-diskless-sync $diskless >/dev/null
    rm -rf "$WORK/rr"; mkdir -p "$WORK/rr"
    COLO_LOG=info timeout 120 $COLORUN redis-server --port "$R" --save '' --appendonly no --dir "$WORK/rr" \
      --enable-debug-command local --replicaof 127.0.0.1 "$M" >"$WORK/rreplica.log" 2>&1 & RP=$!
    for _ in $(seq 400); do timeout 5 redis-cli -p "$R" info replication 2>/dev/null | grep -q master_link_status:up && break; sleep 0.05; done
    check "redis replica (diskless=$diskless): synced 200000 keys, the same digest as its master" sh -c \
      "test \"\$(timeout 10 redis-cli -p $R debug digest)\" = \"\$(timeout 10 redis-cli -p $M debug digest)\" && test \"\$(timeout 10 redis-cli -p $R dbsize)\" = 200000"
    check "... its link to the master over shared memory" grep -q "connect 127.0.0.1:$M: accelerated (shared memory)" "$WORK/rreplica.log"
    kill "$RP"; wait "$RP" 2>/dev/null
  done
fi

if need python3 && need curl; then
  P=$(free_port); mkdir -p "$WORK/hs"; cp "$WORK/10m.bin" "$WORK/hs/"
  (cd "$WORK/hs" && COLO_LOG=info exec timeout 120 $COLORUN python3 -m http.server "$P" --bind 127.0.0.1) >"$WORK/hs.log" 2>&1 & HS=$!; PIDS+=($HS)
  wait_port "$P"
  check "python3 -m http.server: 10 MB, the same bytes" sh -c "timeout 20 $COLORUN curl -sS http://127.0.0.1:$P/10m.bin -o '$WORK/hs.got' && cmp -s '$WORK/hs.got' '$WORK/10m.bin'"
  check "... accepted over shared memory" grep -q "accept .* -> 127.0.0.1:$P: accelerated (shared memory)" "$WORK/hs.log"
fi

if need beanstalkd; then
  B=$(free_port)
  COLO_LOG=info timeout 120 $COLORUN beanstalkd -l 127.0.0.1 -p "$B" >"$WORK/beanstalkd.log" 2>&1 & BP=$!; PIDS+=($BP)
  wait_port "$B"; BP=$(pgrep -P "$BP" -x beanstalkd)
  cat >"$WORK/bs.py" <<'PY'
import socket, sys, os
s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); f = s.makefile("rb")
bodies = [os.urandom(60000) for _ in range(50)]
for b in bodies:
    s.sendall(b"put 0 0 60 %d\r\n" % len(b) + b + b"\r\n")
    assert f.readline().startswith(b"INSERTED")
for b in bodies:
    s.sendall(b"reserve\r\n")
    h = f.readline().split()
    assert f.read(int(h[2]) + 2) == b + b"\r\n"
    s.sendall(b"delete %s\r\n" % h[1])
    assert f.readline() == b"DELETED\r\n"
print("ok")
PY
  check "beanstalkd: 50 jobs of 60 KB put, reserved in order, the same bytes" sh -c "timeout 20 $COLORUN python3 '$WORK/bs.py' $B | grep -qx ok"
  # (The baseline after a first client, as for iperf3 above.)
  bb=$(fds "$BP")
  check "... a second client, the same" sh -c "timeout 20 $COLORUN python3 '$WORK/bs.py' $B | grep -qx ok"
  check "... accepted over shared memory" test "$(acc "$WORK/beanstalkd.log")" -ge 1
  check "... its descriptors come back to $bb" fds_back "$BP" "$bb"
fi

if need git; then
  G=$(free_port); mkdir -p "$WORK/git"
  git init -q "$WORK/git/src" && cp "$WORK/10m.bin" "$WORK/git/src/big" && for i in $(seq 50); do echo "$i" >"$WORK/git/src/f$i"; done
  git -C "$WORK/git/src" add -A && git -C "$WORK/git/src" -c user.name=t -c user.email=t@t commit -qm t && git clone -q --bare "$WORK/git/src" "$WORK/git/repo.git"
  COLO_LOG=info timeout 120 $COLORUN git daemon --reuseaddr --base-path="$WORK/git" --export-all --listen=127.0.0.1 --port="$G" \
    >"$WORK/gitd.log" 2>&1 & PIDS+=($!)
  wait_port "$G"
  check "git daemon: a clone over git://, the same tree" sh -c "timeout 60 env COLO_LOG=info $COLORUN git clone -q git://127.0.0.1:$G/repo.git '$WORK/git/got' 2>'$WORK/gitc.err' &&
    cmp -s '$WORK/git/got/big' '$WORK/10m.bin' && test \"\$(git -C '$WORK/git/got' rev-parse HEAD)\" = \"\$(git -C '$WORK/git/src' rev-parse HEAD)\" && git -C '$WORK/git/got' fsck >/dev/null 2>&1"
  check "... over shared memory" grep -q "connect 127.0.0.1:$G: accelerated (shared memory)" "$WORK/gitc.err"
fi

if need dnsmasq && need dig; then
  D=$(free_port)
  { printf 'no-resolv\nno-hosts\nport=%s\nlisten-address=127.0.0.1\nbind-interfaces\naddress=/example.test/10.1.2.3\n' "$D"
    for i in $(seq 300); do printf 'txt-record=big.test,"%s"\n' "$(head -c 150 /dev/urandom | base64 -w0)"; done; } >"$WORK/dnsmasq.conf"
  COLO_LOG=info timeout 120 $COLORUN dnsmasq -k -C "$WORK/dnsmasq.conf" --log-facility=- >"$WORK/dnsmasq.log" 2>&1 & PIDS+=($!)
  wait_port "$D"
  # 300 TXT records: a TCP answer of about 60 KB.
  check "dnsmasq over TCP: a 300-record answer, the same as over plain TCP" sh -c "
    timeout 10 env COLO_LOG=info $COLORUN dig +tcp +short -p $D @127.0.0.1 big.test TXT >'$WORK/dig.colo' 2>'$WORK/dig.err' &&
    timeout 10 dig +tcp +short -p $D @127.0.0.1 big.test TXT >'$WORK/dig.plain' && test \$(wc -l <'$WORK/dig.colo') = 300 && cmp -s '$WORK/dig.colo' '$WORK/dig.plain'"
  check "... over shared memory" grep -q "connect 127.0.0.1:$D: accelerated (shared memory)" "$WORK/dig.err"
fi

if need tinyproxy && [ -n "${P:-}" ]; then
  T=$(free_port)
  printf 'Port %s\nListen 127.0.0.1\nTimeout 60\nMaxClients 20\nAllow 127.0.0.1\n' "$T" >"$WORK/tinyproxy.conf"
  COLO_LOG=info timeout 120 $COLORUN tinyproxy -d -c "$WORK/tinyproxy.conf" >"$WORK/tinyproxy.log" 2>&1 & PIDS+=($!)
  wait_port "$T"
  check "tinyproxy -> http.server: 10 MB, the same bytes" sh -c "timeout 20 $COLORUN curl -sS -x http://127.0.0.1:$T http://127.0.0.1:$P/10m.bin -o '$WORK/tp.got' && cmp -s '$WORK/tp.got' '$WORK/10m.bin'"
  check "... accepted and connected over shared memory" sh -c "grep -q 'accept .* -> 127.0.0.1:$T: accelerated (shared memory)' '$WORK/tinyproxy.log' &&
    grep -q 'connect 127.0.0.1:$P: accelerated (shared memory)' '$WORK/tinyproxy.log'"
fi

if need ncat; then
  for way in up down; do
    N=$(free_port)
    if [ $way = up ]; then
      COLO_LOG=info timeout 30 $COLORUN ncat -l 127.0.0.1 "$N" >"$WORK/nc.got" 2>"$WORK/ncl.err" & NL=$!
      listening "$N"
      timeout 30 env COLO_LOG=info $COLORUN ncat --send-only 127.0.0.1 "$N" <"$WORK/10m.bin" 2>"$WORK/ncc.err"
    else
      COLO_LOG=info timeout 30 $COLORUN ncat -l --send-only 127.0.0.1 "$N" <"$WORK/10m.bin" 2>"$WORK/ncl.err" & NL=$!
      listening "$N"
      timeout 30 env COLO_LOG=info $COLORUN ncat --recv-only 127.0.0.1 "$N" >"$WORK/nc.got" 2>"$WORK/ncc.err"
    fi
    wait "$NL"
    check "ncat ($way): 10 MB, the same bytes, both ends exit" cmp -s "$WORK/nc.got" "$WORK/10m.bin"
    check "... over shared memory" grep -q "connect 127.0.0.1:$N: accelerated (shared memory)" "$WORK/ncc.err"
  done
fi

# stunnel: a TLS client tunnel into a TLS server tunnel in front of http.server, three hops.
if need stunnel4 && need openssl && [ -n "${P:-}" ]; then
  S=$(free_port) SC=$(free_port)
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$WORK/st.pem" -out "$WORK/st.pem" -days 2 -subj /CN=localhost >/dev/null 2>&1
  printf 'foreground = yes\npid =\n[s]\naccept = 127.0.0.1:%s\nconnect = 127.0.0.1:%s\ncert = %s\n' "$S" "$P" "$WORK/st.pem" >"$WORK/sts.conf"
  printf 'foreground = yes\npid =\n[c]\nclient = yes\naccept = 127.0.0.1:%s\nconnect = 127.0.0.1:%s\n' "$SC" "$S" >"$WORK/stc.conf"
  COLO_LOG=info timeout 120 $COLORUN stunnel4 "$WORK/sts.conf" >"$WORK/sts.log" 2>&1 & PIDS+=($!)
  COLO_LOG=info timeout 120 $COLORUN stunnel4 "$WORK/stc.conf" >"$WORK/stc.log" 2>&1 & PIDS+=($!)
  wait_port "$S"; wait_port "$SC"
  check "stunnel client -> stunnel server (TLS) -> http.server: 10 MB, the same bytes" sh -c "timeout 20 $COLORUN curl -sS http://127.0.0.1:$SC/10m.bin -o '$WORK/st.got' && cmp -s '$WORK/st.got' '$WORK/10m.bin'"
  check "... both tunnels' connections over shared memory" sh -c "grep -q 'connect 127.0.0.1:$S: accelerated (shared memory)' '$WORK/stc.log' &&
    grep -q 'connect 127.0.0.1:$P: accelerated (shared memory)' '$WORK/sts.log'"
fi

# vsftpd, passive mode: curl opens the data connection, then asks for the file on the control
# connection; vsftpd accepts the data connection only after that request. The data connection
# must not wait for an accept that comes only once the client goes on. Its pre-login process
# lowers its limit of open files below what it holds: a blocking recv there must still wait
# (it failed, EINVAL from poll: "500 OOPS: vsf_sysutil_recv_peek", 3-4 logins in 30).
if need vsftpd && need curl; then
  V=$(free_port); mkdir -p "$WORK/ftp/root" "$WORK/ftp/empty"; cp "$WORK/10m.bin" "$WORK/ftp/root/"; chmod 755 "$WORK/ftp" "$WORK/ftp/root"
  printf 'listen=YES\nlisten_address=127.0.0.1\nlisten_port=%s\nanonymous_enable=YES\nanon_root=%s\nlocal_enable=NO\npasv_enable=YES\npasv_address=127.0.0.1\nseccomp_sandbox=NO\nbackground=NO\nsecure_chroot_dir=%s\n' \
    "$V" "$WORK/ftp/root" "$WORK/ftp/empty" >"$WORK/vsftpd.conf"
  COLO_LOG=info timeout 120 $COLORUN vsftpd "$WORK/vsftpd.conf" >"$WORK/vsftpd.log" 2>&1 & PIDS+=($!)
  wait_port "$V"

  check "vsftpd (passive): 10 MB, the same bytes, 5 times" sh -c "for i in 1 2 3 4 5; do timeout 20 env COLO_LOG=info $COLORUN curl -sS ftp://127.0.0.1:$V/10m.bin -o '$WORK/ftp.got' 2>>'$WORK/ftpc.err' && cmp -s '$WORK/ftp.got' '$WORK/10m.bin' || { grep -v '^colo' '$WORK/ftpc.err' '$WORK/vsftpd.log'; exit 1; }; done"
  check "... its control connection over shared memory" grep -q "connect 127.0.0.1:$V: accelerated (shared memory)" "$WORK/ftpc.err"
  check "... no data connection waited out the carrier timeout for vsftpd's accept" no_full_wait "$WORK/ftpc.err"
  # Active mode: vsftpd's session (processes made by a raw clone, past libc's fork handlers)
  # connects to curl's listener, as nobody: curl accepts only once vsftpd's reply to RETR came,
  # which vsftpd sends once connected, so the connection goes on over TCP after the bounded wait
  # for a late accept (docs/LIMITS.md, "When a connection is accelerated"; accelerated with connect_from_port_20,
  # where root connects and need not wait).
  check "vsftpd (active): 10 MB, the same bytes, 3 times" sh -c "for i in 1 2 3; do timeout 20 env COLO_LOG=info $COLORUN curl -sS -P 127.0.0.1 ftp://127.0.0.1:$V/10m.bin -o '$WORK/ftpa.got' 2>>'$WORK/ftpa.err' && cmp -s '$WORK/ftpa.got' '$WORK/10m.bin' || { grep -v '^colo' '$WORK/ftpa.err' '$WORK/vsftpd.log'; exit 1; }; done"
fi

# Synchronous workers behind an event-loop client: each worker accepts one connection and
# waits for its request, which the client sends only once it has made its other connections.
# The client must not wait for accepts that cannot come (it did, COLO_CARRIER_TIMEOUT_MS per
# connection: over 2 s wrk timed out and counted 1 request a second).
if need gunicorn && need wrk; then
  U=$(free_port)
  printf 'def app(env, start):\n    start("200 OK", [("Content-Length", "2")])\n    return [b"ok"]\n' >"$WORK/wsgi_app.py"
  (cd "$WORK" && COLO_LOG=info exec timeout 120 $COLORUN gunicorn -w 2 -b "127.0.0.1:$U" wsgi_app:app) >"$WORK/gunicorn.log" 2>&1 & PIDS+=($!)
  wait_port "$U"
  out=$(timeout 30 env COLO_LOG=info $COLORUN wrk -t1 -c10 -d1s "http://127.0.0.1:$U/" 2>"$WORK/wrk-gu.err")
  check "gunicorn -w 2 under wrk -c10: requests answered, no socket errors (no timeout)" sh -c "echo '$out' | grep -q Requests/sec && ! echo '$out' | grep -qE 'Socket errors|Non-2xx'"
  check "... some connections over shared memory" grep -q "connect 127.0.0.1:$U: accelerated (shared memory)" "$WORK/wrk-gu.err"
  check "... none waited out the carrier timeout for a worker's accept" no_full_wait "$WORK/wrk-gu.err"
fi

# Debian names php-fpm by its PHP version.
PHPFPM=$(ls /usr/sbin/php-fpm* 2>/dev/null | sort -V | tail -n 1)
if [ -z "$PHPFPM" ]; then bad "php-fpm is not installed (tests/apps/packages.txt)"; elif need nginx && need wrk; then
  F=$(free_port) X=$(free_port); mkdir -p "$WORK/php/logs"
  printf '<?php echo md5(file_get_contents("php://input")), "\\n";\n' >"$WORK/php/md5.php"
  cat >"$WORK/php/fpm.conf" <<F
[global]
error_log = $WORK/php/logs/fpm.log
daemonize = no
[www]
listen = 127.0.0.1:$F
pm = static
pm.max_children = 2
user = nobody
group = nogroup
php_admin_value[post_max_size] = 16M
F
  cat >"$WORK/php/nginx.conf" <<N
worker_processes 1; daemon off; pid $WORK/php/nginx.pid; error_log $WORK/php/logs/error.log warn;
events { worker_connections 1024; }
http { access_log off; client_max_body_size 16m; client_body_temp_path $WORK/php/body; fastcgi_temp_path $WORK/php/fcgi;
  server { listen 127.0.0.1:$X; root $WORK/php;
    location ~ \.php\$ { fastcgi_pass 127.0.0.1:$F; fastcgi_param SCRIPT_FILENAME \$document_root\$fastcgi_script_name;
      fastcgi_param REQUEST_METHOD \$request_method; fastcgi_param CONTENT_LENGTH \$content_length; } } }
N
  COLO_LOG=info timeout 120 $COLORUN "$PHPFPM" -y "$WORK/php/fpm.conf" -F >"$WORK/php/fpm.out" 2>&1 & PIDS+=($!)
  COLO_LOG=info timeout 120 $COLORUN nginx -c "$WORK/php/nginx.conf" -p "$WORK/php" >"$WORK/php/nginx.out" 2>&1 & PIDS+=($!)
  wait_port "$F"; wait_port "$X"
  check "nginx -> php-fpm (FastCGI): a 10 MB request body, the same bytes at the worker" sh -c \
    "test \"\$(timeout 20 $COLORUN curl -sS --data-binary @'$WORK/10m.bin' http://127.0.0.1:$X/md5.php)\" = \"\$(md5sum <'$WORK/10m.bin' | cut -c1-32)\""
  out=$(timeout 30 $COLORUN wrk -t1 -c4 -d1s "http://127.0.0.1:$X/md5.php" 2>&1)
  check "... wrk -c4: requests answered, no socket errors (no timeout)" sh -c "echo '$out' | grep -q Requests/sec && ! echo '$out' | grep -qE 'Socket errors|Non-2xx'"
  check "... nginx's FastCGI connections over shared memory" grep -q "connect 127.0.0.1:$F: accelerated (shared memory)" "$WORK/php/logs/error.log"
  check "... none waited out the carrier timeout for a worker's accept" no_full_wait "$WORK/php/logs/error.log"
fi

# Erlang distribution, both nodes under colo run: 10 client nodes one after another, each 200
# rpc calls to the server node. Erlang's poll thread sleeps in epoll_wait while scheduler threads
# re-arm its one-shot registrations (EPOLL_CTL_MOD): a re-arm that comes between the poll thread's
# look at its registrations and its sleep must still wake it when the peer's next bytes come
# (docs/ARCHITECTURE.md, "A sleeping epoll_wait announces...").
if need erl; then
  EH=$(mktemp -d "$WORK/erl.XXXXXX"); ES=$(hostname -s)
  HOME=$EH COLO_LOG=info timeout 120 $COLORUN erl -sname "srv$$" +IOs false -setcookie colo -noshell -noinput >"$EH/srv.log" 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do HOME=$EH timeout 2 epmd -names 2>/dev/null | grep -q "srv$$" && break; sleep 0.05; done
  done_ok=0
  for i in $(seq 10); do
    r=$(HOME=$EH timeout 20 env COLO_LOG=info $COLORUN erl -sname "c$$-$i" +IOs false -setcookie colo -noshell \
      -eval "R=[rpc:call('srv$$@$ES',lists,seq,[1,2000]) || _ <- lists:seq(1,200)], io:format(\"~p~n\",[length([x || L <- R, length(L) =:= 2000])]), halt()." </dev/null 2>>"$EH/cli.log")
    [ "$r" = 200 ] && done_ok=$((done_ok + 1))
  done
  check "erlang distribution: 10 of 10 client nodes made their 200 rpc calls ($done_ok)" test "$done_ok" = 10
  check "... over shared memory" grep -q "accept .*: accelerated (shared memory)" "$EH/srv.log"
  HOME=$EH epmd -kill >/dev/null 2>&1
fi

[ $FAIL = 0 ] && echo "tests/apps/daemons2.sh: all passed" || echo "tests/apps/daemons2.sh: FAILURES"
exit $FAIL
