"""Run as nobody by t_rt_scribble_client.sh: a hostile colo server on 127.0.0.1:PORT (its own TCP
listener and rendezvous, so root's clients trust it as TCP would reach it: spec/WIRE.md section
2) that welcomes each HELLO (DIRECT, or CARRIER once it accepted the offer's TCP connection),
reads and answers nothing, and leaves one adversarial value in one shared word of each
connection's segment (the words the client reads, and its own), in turn through the list
below (connection k gets SCRIBBLES[k % len]), SETTLE seconds after its WELCOME (the client by
then waits to read, or to write into a ring it filled), rings the client once and goes silent.
It holds every connection until SECONDS after the last one.
Prints "LISTENING", then "SCRIBBLED <k> <label>" per connection, "RESULT held=<n>" at the end.
Usage: scribble_server.py PORT COUNT SETTLE SECONDS"""
import ctypes
import mmap
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402

port, count, settle, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
M64 = 2**64 - 1
CLIENT_WAITING = 128
# (label, [(block or None for the header, offset, bytes, value or callable(current) -> value)])
SCRIBBLES = []
for b in ("c2s", "s2c"):
    for v in (M64, 2**63, lambda c: c + 1, lambda c: c + 65537, lambda c: c - 1):
        SCRIBBLES.append((b + ".head", [(b, 0, 8, v)]))
    for v in (1, 2, 4, 8, 0xFFFFFFFF):
        SCRIBBLES.append((b + ".flags", [(b, 8, 4, v)]))
    for v in (0, 3, 4096, 65536, 0x80000000, 0xFFFFFFFF):
        SCRIBBLES.append((b + ".ring_size", [(b, 12, 4, v)]))
    for v in (1, 65535, 0xFFFFFFFF):
        SCRIBBLES.append((b + ".space_wake", [(b, 16, 4, v)]))
    for v in (M64, lambda c: c + 1, lambda c: c - 1):
        SCRIBBLES.append((b + ".tail", [(b, 128, 8, v)]))
    for v in (1, 0xFFFFFFFF):
        SCRIBBLES.append((b + ".read_flags", [(b, 136, 4, v)]))
    SCRIBBLES.append((b + ".msg_words", [(b, o, 8, M64) for o in (256, 384, 512, 640)]))
for v in (0, 1, 3, 0xFFFFFFFF):
    SCRIBBLES.append(("claim", [(None, 36, 4, v)]))
for v in (1, 2, 3, 0xFFFFFFFF):
    SCRIBBLES.append(("parked", [(None, 96, 4, v)]))
for v in (0, 1, 2, 3, 0x100, 0xFFFFFFFF):
    SCRIBBLES.append(("client_waiting", [(None, CLIENT_WAITING, 4, v)]))
for v in (3, 0xFFFFFFFF):
    SCRIBBLES.append(("server_waiting", [(None, 256, 4, v)]))
for v in (0, M64, 12345):
    SCRIBBLES.append(("c2s_written", [(None, 384, 8, v)]))
    SCRIBBLES.append(("s2c_written", [(None, 512, 8, v)]))
# Another holder of the client's end "wrote" (c2s_written differs from its head): an end that
# takes over from ring_head reads the ring's words back.
for words in ([("c2s", 12, 4, 0)], [("c2s", 12, 4, 0xFFFFFFFF)], [("c2s", 0, 8, M64)], [("c2s", 16, 4, 0xFFFFFFFF)]):
    SCRIBBLES.append(("c2s_written+" + ",".join(str(w[1]) for w in words), [(None, 384, 8, 777)] + words))
# Our direction claims a full ring of bytes the client has not seen, at each mark.
for v in (0, 1, 0xFFFFFFFF):
    SCRIBBLES.append(("s2c.full+space_wake", [("s2c", 12, 4, "cap"), ("s2c", 0, 8, "full"), ("s2c", 16, 4, v)]))
only = os.environ.get("SCRIBBLE_ONLY")
if only:
    SCRIBBLES = [s for s in SCRIBBLES if only in s[0]]
LIBC = ctypes.CDLL(None, use_errno=True)
ca.raise_nofile()

tcp = socket.socket()
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("127.0.0.1", port))
tcp.listen(1024)
rv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
rv.bind(b"\0colo/1/127.0.0.1:%d" % port)
rv.listen(1024)
print("LISTENING", flush=True)
accepted, lock = {}, threading.Lock()


def accept_tcp():
    while True:
        try:
            c, a = tcp.accept()
        except OSError:
            return
        with lock:
            accepted[a] = c


threading.Thread(target=accept_tcp, daemon=True).start()
held, last = [], time.time()


def scribble(k, ctl, fd, m, size):
    block = (size - ca.HEADER) // 2
    base = {"c2s": ca.HEADER, "s2c": ca.HEADER + block, None: 0}
    capacity = struct.unpack_from("<I", m, 24)[0]
    label, words = SCRIBBLES[k % len(SCRIBBLES)]
    time.sleep(settle)
    for blk, off, n, v in words:
        at = base[blk] + off
        cur = struct.unpack_from("<Q" if n == 8 else "<I", m, at)[0]
        if v == "cap":
            v = capacity
        elif v == "full":
            v = cur + capacity - (struct.unpack_from("<Q", m, base["s2c"])[0] - struct.unpack_from("<Q", m, base["s2c"] + 128)[0])
        elif callable(v):
            v = v(cur)
        struct.pack_into("<Q" if n == 8 else "<I", m, at, v % (2**64 if n == 8 else 2**32))
    try:
        ctl.send(b"r", socket.MSG_DONTWAIT)
    except OSError:
        pass
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m, CLIENT_WAITING))
    LIBC.syscall(202, ctypes.c_void_p(addr), 1, 0x7FFFFFFF, None, None, 0)  # FUTEX_WAKE
    print("SCRIBBLED %d %s" % (k, label), flush=True)


threads = []
rv.settimeout(60)
for k in range(count):
    try:
        ctl, _ = rv.accept()
    except OSError:
        break
    ctl.settimeout(5)
    try:
        msg, fds, _, _ = socket.recv_fds(ctl, 64, 4)
    except OSError:
        continue
    if len(msg) < 16 or msg[4] != ca.HELLO or len(fds) != 1:
        print("no HELLO:", msg, len(fds), flush=True)
        continue
    mode, fd = msg[6], fds[0]
    size = os.fstat(fd).st_size
    m = mmap.mmap(fd, size)
    if mode == ca.CARRIER:
        fam, cport = struct.unpack_from("<HH", m, 48)
        cip = socket.inet_ntoa(bytes(m[52:56]))
        end = time.time() + 5
        while time.time() < end:
            with lock:
                conn = accepted.pop((cip, cport), None)
            if conn:
                break
            time.sleep(0.005)
        else:
            print("no carrier for", cip, cport, flush=True)
            continue
        held.append(conn)
        struct.pack_into("<I", m, 36, 2)  # claim: CLAIMED
    struct.pack_into("<I", m, 44, os.getpid())
    ctl.send(ca.message(ca.WELCOME))
    held.append((ctl, fd, m))
    t = threading.Thread(target=scribble, args=(k, ctl, fd, m, size))
    t.start()
    threads.append(t)
for t in threads:
    t.join()
print("ALL %d" % len(threads), flush=True)
time.sleep(hold)
print("RESULT held=%d" % len(threads), flush=True)
