"""Run as nobody by t_rt_big_ring.sh: N CARRIER connections to root's server at 127.0.0.1:PORT
whose segments offer 64 MiB rings (the largest a segment of 256 MiB holds), each of which asks
the server for more than that and never reads what comes back: `echo` writes 96 MiB into its
ring toward the server (the server echoes it), `http` sends `GET /big` (a file larger than the
ring). Once the server's writing stalls, prints "S2C <ring_size> <unread bytes>" per connection
and "READY", and exits (the checks are on those lines). With a fourth argument, the server's own
ring words are set too: `preset` makes the segment with the server's ring (S2C) at its largest
size, `scribble` sets that size and the server's `s2c_written` copy (header offset 512, which
sends a producer back to the shared words) once answered. Usage: big_ring.py PORT N echo|http [preset|scribble]"""
import fcntl
import mmap
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402

port, n, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
words = sys.argv[4] if len(sys.argv) > 4 else ""
RING = 64 << 20
SIZE = ca.segment_size(RING, 0, 0)
C2S, S2C, DATA = ca.HEADER, ca.HEADER + (SIZE - ca.HEADER) // 2, 1024
S2C_WRITTEN = 512
if words == "preset":
    honest = ca.make_segment

    def make_segment(*a, **k):
        fd = honest(*a, seal=False)
        os.pwrite(fd, struct.pack("<I", RING), S2C + 12)
        fcntl.fcntl(fd, ca.F_ADD_SEALS, ca.F_SEAL_SEAL | ca.F_SEAL_SHRINK | ca.F_SEAL_GROW)
        return fd
    ca.make_segment = make_segment
rd = lambda m, o, k: struct.unpack_from("<Q" if k == 8 else "<I", m, o)[0]  # noqa: E731


def ring(c):
    ctl, m = c
    ca.ring(m, ca.SERVER_WAITING, ctl)


conns, keep = [], []
for _ in range(n):
    t, ctl, fd = ca.carrier_offer(RING, port)
    a = ca.answer(ctl)
    print("answer", a, flush=True)
    if a != "WELCOME":
        continue
    m = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    struct.pack_into("<I", m, C2S + 12, RING)  # our ring toward the server, at its largest
    if words == "scribble":
        struct.pack_into("<I", m, S2C + 12, RING)
        struct.pack_into("<Q", m, S2C_WRITTEN, 0x5A5A5A5A)
    keep.append((t, fd))
    conns.append((ctl, m))
    if mode == "http":
        req = b"GET /big HTTP/1.0\r\n\r\n"
        m[C2S + DATA:C2S + DATA + len(req)] = req
        struct.pack_into("<Q", m, C2S, len(req))
        ring(conns[-1])
# echo: keep the server's input ring topped up (96 MiB in all) until the server stops taking it.
chunk = b"x" * (1 << 20)
sent = [0] * len(conns)
last, still = [-1] * len(conns), 0
while mode == "echo" and still < 20:
    moved = False
    for i, c in enumerate(conns):
        m = c[1]
        head, tail = rd(m, C2S, 8), rd(m, C2S + 128, 8)
        k = min(len(chunk), RING - (head - tail), (96 << 20) - sent[i])
        if k > 0:
            at = head % RING
            first = min(k, RING - at)
            m[C2S + DATA + at:C2S + DATA + at + first] = chunk[:first]
            m[C2S + DATA:C2S + DATA + k - first] = chunk[:k - first]
            struct.pack_into("<Q", m, C2S, head + k)
            sent[i] += k
            moved = True
        ring(c)
    still = 0 if moved else still + 1
    time.sleep(0.05)
# The server's side: wait until its writing stalls (its unread bytes stop growing).
prev, steady = None, 0
while steady < 10:
    now = [rd(m, S2C, 8) for _, m in conns]
    steady = steady + 1 if now == prev else 0
    prev = now
    time.sleep(0.1)
for _, m in conns:
    print("S2C %d %d" % (rd(m, S2C + 12, 4), rd(m, S2C, 8) - rd(m, S2C + 128, 8)), flush=True)
print("READY", len(conns), flush=True)
