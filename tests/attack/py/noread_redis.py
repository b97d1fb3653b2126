"""Run as nobody by t_rt_poll_room.sh: one CARRIER connection to root's redis at
127.0.0.1:PORT whose segment offers 64 MiB rings; it asks for a 40 MiB answer (SET of 1 MiB,
then 40 GETs of it) and reads nothing. Once the server's writing stalls, prints
"S2C <unread bytes>" and "READY", then holds the connection for SECONDS.
Usage: noread_redis.py PORT SECONDS"""
import mmap
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402

port, hold = int(sys.argv[1]), float(sys.argv[2])
RING = 64 << 20
SIZE = ca.segment_size(RING, 0, 0)
C2S, S2C, DATA = ca.HEADER, ca.HEADER + (SIZE - ca.HEADER) // 2, 1024
t, ctl, fd = ca.carrier_offer(RING, port)
print("answer", ca.answer(ctl), flush=True)
m = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
struct.pack_into("<I", m, C2S + 12, RING)  # our ring toward the server, at its largest
val = b"v" * (1 << 20)
req = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n%s\r\n" % (len(val), val) + b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n" * 40
m[C2S + DATA:C2S + DATA + len(req)] = req
struct.pack_into("<Q", m, C2S, len(req))
ctl.send(b"r", socket.MSG_DONTWAIT)
rd = lambda o: struct.unpack_from("<Q", m, o)[0]  # noqa: E731
prev, steady = None, 0
while steady < 10:
    now = rd(S2C)
    steady = steady + 1 if now == prev else 0
    prev = now
    time.sleep(0.1)
print("S2C", rd(S2C) - rd(S2C + 128), flush=True)
print("READY", flush=True)
time.sleep(hold)
