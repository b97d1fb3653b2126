"""Run as nobody by t_rt_relay_pair_squat.sh: watches /proc/net/tcp{,6} for loopback TCP
listeners that appear after it started (the shim's relay makes one, with a backlog of 1, and
connects to it right after) and connects to each new one four times, keeping the connections
open. Prints "HIT <port>" for each, then "RESULT hits=<n>" after SECONDS.
Usage: relay_pair_squat.py SECONDS"""
import socket
import sys
import time

secs = float(sys.argv[1])


def listeners():
    out = set()
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(f).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            p = line.split()
            if p[3] == "0A":  # TCP_LISTEN
                out.add((f.endswith("6"), int(p[1].split(":")[1], 16)))
    return out


seen = listeners()
held, hits = [], 0
print("WATCHING", flush=True)
end = time.time() + secs
while time.time() < end:
    now = listeners()
    for v6, port in now - seen:
        for _ in range(4):
            s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET)
            s.setblocking(False)
            try:
                s.connect(("::1" if v6 else "127.0.0.1", port))
            except OSError:
                pass
            held.append(s)
        hits += 1
        print("HIT", port, flush=True)
    seen |= now
print("RESULT hits=%d" % hits, flush=True)
