"""Run as nobody by t_rt_orphan_bytes.sh: K CARRIER connections to a server at PORT that writes
N bytes to each connection it accepts and closes it. Never reads them, and keeps every
connection open (control socket, memfd, mapping): the server's pages of those bytes, in our
memfds, stay charged to its memory cgroup until they go. Prints "CLOSED K HELD <KiB>" once the
server closed them all (what of its rings is allocated in our memfds), then every 2 s
"HELD <seconds> <KiB>", and "FREED <seconds>" once at most a page a connection is left (or
"STILL <KiB>" after WAIT seconds), and then "FLAGS <hex> LATE_FLAGS <hex>" (the S2C ring_flags
of each connection but the first, or'ed together, and of the first). The first connection's
bytes are read 40 s after the close ("LATE <seconds> <bytes> intact|damaged"): a peer that reads
within the minute gets them all.
Usage: orphan.py PORT K N RING WAIT"""
import mmap, os, socket, struct, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import colo_attack as ca
port, k, n, ring, wait = (int(a) for a in sys.argv[1:6])
LATE = 40  # seconds after the server closed: within the minute a reader has
size = ca.segment_size(ring, 0, 0)
blk = (size - ca.HEADER) // 2
S2C, DATA = ca.HEADER + blk, 1024
ca.raise_nofile()
conns = []
for i in range(k):
    tcp, ctl, fd = ca.carrier_offer(ring, port)
    a = ca.answer(ctl)
    if a != "WELCOME":
        print("answer", i, a, flush=True); sys.exit(1)
    conns.append((tcp, ctl, fd, mmap.mmap(fd, size)))
t_end = time.time() + 60
while time.time() < t_end:
    fins = sum(1 for c in conns if struct.unpack_from("<I", c[3], S2C + 8)[0] & 1)
    if fins == k:
        break
    time.sleep(0.2)
held = lambda: sum(ca.allocated(c[2], S2C + DATA, S2C + DATA + ring) for c in conns) >> 10
head = sum(struct.unpack_from("<Q", c[3], S2C)[0] for c in conns)
print("CLOSED", fins, "HELD", held(), "HEAD", head, flush=True)
start = time.time()
late = None
while True:
    time.sleep(2)
    h, t = held(), int(time.time() - start)
    print("HELD", t, h, flush=True)
    if late is None and t >= LATE:
        # The first connection's bytes, read late (but within the minute): all of them, intact.
        m = conns[0][3]
        head, tail = struct.unpack_from("<Q", m, S2C)[0], struct.unpack_from("<Q", m, S2C + 128)[0]
        rsize = struct.unpack_from("<I", m, S2C + 12)[0]
        got = bytearray()
        while tail + len(got) < head:
            at = (tail + len(got)) % rsize
            got += m[S2C + DATA + at:S2C + DATA + min(rsize, at + head - tail - len(got))]
        late = len(got) == n and got.count(b"o") == n
        struct.pack_into("<Q", m, S2C + 128, head)
        print("LATE", t, len(got), "intact" if late else "damaged", flush=True)
    if h <= 4 * k:
        print("FREED", t, flush=True)
        break
    if t >= wait:
        print("STILL", h, flush=True)
        break
flags = 0
for c in conns[1:]:
    flags |= struct.unpack_from("<I", c[3], S2C + 8)[0]
print("FLAGS %x LATE_FLAGS %x" % (flags, struct.unpack_from("<I", conns[0][3], S2C + 8)[0]), flush=True)
