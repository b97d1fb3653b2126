"""Run as nobody by t_rt_hole_reads.sh: one CARRIER connection to root's server at
127.0.0.1:PORT with a 64 MiB ring toward it, in which it claims CLAIM bytes it never writes
(holes), after PREFIX (a request that makes the server read them all). Once the server has read
them (its ring_tail), or its ring toward us is full and neither side of it moves, closes everything but the memfd and prints "ALLOCATED <while> <after>":
the memfd's allocated MiB while connected and 3 s after the close (pages the server's reads
made: they are charged to the server), counted in the ring toward the server only (SEEK_DATA).
Usage: hole_reads.py PORT CLAIM PREFIX"""
import mmap
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402

port, claim, prefix = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode().decode("unicode_escape").encode("latin-1")
RING = 64 << 20
SIZE = ca.segment_size(RING, 0, 0)
C2S, DATA = ca.HEADER, 1024
t, ctl, fd = ca.carrier_offer(RING, port)
print("answer", ca.answer(ctl), flush=True)
m = mmap.mmap(fd, SIZE)
S2C = ca.HEADER + (SIZE - ca.HEADER) // 2


def mib():
    """MiB of pages allocated in the client-to-server block (SEEK_DATA/SEEK_HOLE)."""
    return ca.allocated(fd, C2S, S2C) >> 20


m[C2S + DATA:C2S + DATA + len(prefix)] = prefix
struct.pack_into("<I", m, C2S + 12, RING)
struct.pack_into("<Q", m, C2S, len(prefix) + claim)  # the claimed bytes are never written
ca.ring(m, ca.SERVER_WAITING, ctl)
# Until the server has read every claimed byte or can read no more: an echo server stops once
# its ring toward us is full (we read nothing), and then neither its reads nor its writes move
# (for 2 s); 20 s at most.
rd = lambda o: struct.unpack_from("<Q", m, o)[0]  # noqa: E731
end, prev, steady = time.time() + 20, None, 0
while time.time() < end and rd(C2S + 128) < len(prefix) + claim and steady < 40:
    time.sleep(0.05)
    now = (rd(C2S + 128), rd(S2C))
    full = now[1] - rd(S2C + 128) >= struct.unpack_from("<I", m, S2C + 12)[0] > 0
    steady = steady + 1 if full and now == prev else 0
    prev = now
tail = rd(C2S + 128)
during = mib()
m.close()
ctl.close()
t.close()
time.sleep(3)
print("READ %d" % tail, flush=True)
print("ALLOCATED %d %d" % (during, mib()), flush=True)
