"""Run as nobody, a listed tenant, by t_rt_netns_norv_stall.sh: opens N TCP connections to HOST:PORT
that send nothing and holds them SECONDS. Prints "ERR <error>" per connection that failed, then
"SILENT <made>".
Usage: silent_conns.py HOST PORT N SECONDS"""
import socket
import sys
import time

host, port, n, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
held = []
for _ in range(n):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((host, port))
        held.append(s)
    except OSError as e:
        print("ERR", e, flush=True)
print("SILENT", len(held), flush=True)
time.sleep(secs)
