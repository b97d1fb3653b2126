"""Run as nobody, a listed tenant (inside the server's COLO_NETNS_CLIENTS), by
t_rt_netns_evict_inject.sh against a busy Rust API listener (one that waits between accepts): fills
the listener's set of waiting cross-namespace connections with connections in their HELLO wait
(PROPOSALs, answered ACCEPT, never followed by a HELLO): twice N of them, each batch made to be
taken in by one accept call by a plain connection behind it that the echo server answers. Prints
"PHASE <i> <echo>" per batch and "FILLED", then waits (at most 5 s) until the file GO exists (the
victim has connected), and queues SILENT connections that send nothing right behind the victim's,
so that taking them in pushes the oldest waiting connection out of the set. Prints "BEHIND <n>",
then holds every connection for 5 s.
Usage: netns_evict.py HOST PORT GO [N [SILENT]]   (N 127, SILENT 20)"""
import os
import socket
import sys
import time

host, port, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
n = int(sys.argv[4]) if len(sys.argv) > 4 else 127
silent = int(sys.argv[5]) if len(sys.argv) > 5 else 20
with open("/proc/sys/kernel/random/boot_id") as f:
    boot = bytes.fromhex(f.read().strip().replace("-", ""))
# spec/WIRE.md: magic, type 1 (PROPOSAL), version 1, reserved, the host's boot id, a nonce.
prop = b"\0COLO-NS\x01\x01" + b"\0" * 6 + boot + os.urandom(8)
keep = []


def conn(data):
    s = socket.socket()
    s.settimeout(5)
    s.connect((host, port))
    if data:
        s.sendall(data)
    keep.append(s)
    return s


for phase in range(2):
    for _ in range(n):
        conn(prop)
    p = conn(b"ping\n")
    try:
        print("PHASE", phase, p.recv(10), flush=True)
    except OSError as e:
        print("PHASE", phase, "no echo", e, flush=True)
print("FILLED", flush=True)
for _ in range(1000):
    if os.path.exists(go):
        break
    time.sleep(0.005)
time.sleep(0.03)
for _ in range(silent):
    conn(None)
print("BEHIND", silent, flush=True)
time.sleep(5)
