"""Run as nobody by t_rt_fork_claimed.sh: a server on 127.0.0.1:PORT that speaks colo's
rendezvous and never accepts its TCP connections. It takes each CARRIER HELLO, maps the
segment, moves its claim word from OFFERED to CLAIMED (as a server that claims does) and never
sends the answer; it holds everything for SECONDS. Prints "LISTENING", then "CLAIMED <n>".
Usage: claim_silent.py PORT SECONDS"""
import mmap
import os
import socket
import struct
import sys
import time

port, hold = int(sys.argv[1]), float(sys.argv[2])
CLAIM, OFFERED, CLAIMED = 36, 1, 2
tcp = socket.socket()
tcp.bind(("127.0.0.1", port))
tcp.listen(64)
rv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
rv.bind(b"\0colo/1/127.0.0.1:%d" % port)
rv.listen(64)
print("LISTENING", flush=True)
held, n = [], 0
rv.settimeout(0.2)
end = time.time() + hold
while time.time() < end:
    try:
        c, _ = rv.accept()
    except socket.timeout:
        continue
    c.settimeout(2)
    try:
        msg, fds, _, _ = socket.recv_fds(c, 64, 4)
    except OSError:
        continue
    if len(msg) != 16 or len(fds) != 1:
        continue
    m = mmap.mmap(fds[0], 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    if struct.unpack_from("<I", m, CLAIM)[0] == OFFERED:
        struct.pack_into("<I", m, CLAIM, CLAIMED)
        n += 1
        print("CLAIMED", n, flush=True)
    held.append((c, fds, m))
