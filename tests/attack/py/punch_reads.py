"""Run as nobody by t_rt_punch_reads.sh: N CARRIER connections to root's server at
127.0.0.1:PORT, each a producer that punches its own ring's pages while the server reads them.
Each connection writes PREFIX (a request that makes the server read CLAIM bytes after it) and
256 KiB of bytes into its ring toward the server, sets the ring's size to 256 KiB, then starts a
thread that gives back every data page of that ring but its first (MADV_REMOVE, which is
fallocate(PUNCH_HOLE) through the mapping) over and over, and claims the CLAIM bytes 64 KiB at a
time as the server reads (the ring wraps 64 times for 16 MiB), never writing again: each read
of the server finds the bytes written, or holes punched a moment before, or a page punched under
its copy. Then it stops punching, claims one more lap of the ring (256 KiB of holes, all of it
punched) for the server to read, and prints "READ <bytes> by <connections>" and
"ALLOCATED <window> <beyond>": the bytes of pages allocated in the data of the rings (but their
first page, which holds the ring's words), below the window the server reads through its
mapping (colo::segment::MAPPED_WINDOW, its bytes 0..WINDOW, whole pages) and above it. No page
there is nobody's once punched: every one is a page the server's reads allocated, charged to it.
Usage: punch_reads.py PORT N CLAIM PREFIX WINDOW"""
import mmap, os, struct, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca
port, n, claim, window = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
prefix = sys.argv[4].encode().decode("unicode_escape").encode("latin-1")
CAP, SIZE_RING, STEP = 64 << 20, 256 << 10, 64 << 10
C2S, DATA = ca.HEADER, 1024
HEAD, TAIL, RING_SIZE = C2S, C2S + 128, C2S + 12
first = ca.round_up(C2S + DATA, 4096)  # the first data page after the one holding the words
end = C2S + DATA + SIZE_RING
cut = ca.round_up(C2S + DATA + window, 4096)  # pages from here on hold no byte below the window
stop = threading.Event()


def punch(maps):
    while not stop.is_set():
        for m in maps:
            m.madvise(mmap.MADV_REMOVE, first, end - first)


def tail(m):
    return struct.unpack_from("<Q", m, TAIL)[0]


def claim_to(m, ctl, total, deadline):
    """Claims bytes up to `total` (written or not) as room frees, ringing the server."""
    head = struct.unpack_from("<Q", m, HEAD)[0]
    while tail(m) < total and time.time() < deadline:
        room = SIZE_RING - (head - tail(m))
        if head < total and room >= min(STEP, total - head):
            head += min(STEP, total - head, room)
            struct.pack_into("<Q", m, HEAD, head)
            ca.ring(m, ca.SERVER_WAITING, ctl)
        else:
            time.sleep(0.001)


conns = ca.welcomed_carriers(CAP, port, n)
maps = [c[3] for c in conns]
for m in maps:
    m[C2S + DATA:end] = (prefix + b"x" * SIZE_RING)[:SIZE_RING]
    struct.pack_into("<I", m, RING_SIZE, SIZE_RING)
for m in maps:  # the bytes written are given back once before any is claimed
    m.madvise(mmap.MADV_REMOVE, first, end - first)
puncher = threading.Thread(target=punch, args=(maps,))
puncher.start()
deadline = time.time() + 60
for t, ctl, fd, m in conns:
    claim_to(m, ctl, len(prefix) + claim - SIZE_RING, deadline)
stop.set()
puncher.join()
for t, ctl, fd, m in conns:
    claim_to(m, ctl, len(prefix) + claim, deadline)
print("READ", sum(tail(m) for m in maps), "by", len(conns), flush=True)
below = sum(ca.allocated(c[2], first, cut) for c in conns)
beyond = sum(ca.allocated(c[2], cut, end) for c in conns)
print("ALLOCATED %d %d" % (below, beyond), flush=True)
