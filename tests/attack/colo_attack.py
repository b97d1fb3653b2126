"""A hostile colo client in Python, for tests/attack (spec/WIRE.md sections 2-6).

Speaks the handshake byte for byte (messages and header as in spec/vectors) without any colo
library, so that it can do what an honest client never does: reuse one memfd, offer and never
connect, scribble on the shared words. Run as nobody by the t_*.sh scripts:
    python3 colo_attack.py COMMAND PORT [ARGS...]
Prints one result line ("RESULT key=value ...") that the scripts parse.
"""

import ctypes
import mmap
import os
import resource
import socket
import struct
import sys
import time
import fcntl

MSG_MAGIC = 0x4F4C4F43
HELLO, WELCOME, REJECT = 1, 2, 3
DIRECT, CARRIER = 1, 2
REASONS = {1: "BAD_MESSAGE", 2: "BAD_VERSION", 3: "BAD_SEGMENT", 4: "NEED_CARRIER", 5: "NOT_CLAIMED", 6: "NO_RESOURCES"}
CLAIM_DIRECT, CLAIM_OFFERED = 0, 1
SERVER_WAITING = 256
CLIENT_WAITING = 128
SLEEP_FUTEX = 2

F_ADD_SEALS, F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW = 1033, 1, 2, 4


def ring(m, waiting, ctl=None):
    """Wakes the side whose waiting word is at offset `waiting` of the mapping `m` as a producer
    does (spec/WIRE.md section 6): rings its doorbell (the control socket `ctl`, a socket or a
    descriptor, if given), takes the sleep bits from its waiting word, then wakes its futex. A
    futex wake without taking the bits is lost on a side that announced its sleep and has not
    reached its futex wait yet: it then sleeps on an unchanged word."""
    if ctl is not None:
        try:
            if isinstance(ctl, int):
                os.write(ctl, b"r")
            else:
                ctl.send(b"r", socket.MSG_DONTWAIT)
        except OSError:
            pass
    struct.pack_into("<I", m, waiting, 0)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m, waiting))
    ctypes.CDLL(None, use_errno=True).syscall(202, ctypes.c_void_p(addr), 1, 0x7FFFFFFF, None, None, 0)  # FUTEX_WAKE


def allocated(fd, start, end):
    """Bytes of pages allocated in the file `fd` between offsets `start` and `end`
    (SEEK_DATA/SEEK_HOLE: a hole costs nothing)."""
    at, total = start, 0
    while at < end:
        try:
            data = os.lseek(fd, at, os.SEEK_DATA)
        except OSError:
            break
        if data >= end:
            break
        at = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        total += at - data
    return total


def claim_ring_toward_client(seg, ctl):
    """As the server of the segment `seg` (a memfd) whose control socket is `ctl` (or None):
    claims a whole ring of bytes toward the client without writing them (holes) and FIN, rings
    the client, waits up to 20 s for it to read them, and prints "READ <n> of <ring>" and
    "ALLOCATED <MiB>": the pages allocated in the server-to-client block (SEEK_DATA), which the
    client's reads of the holes made (charged to the client)."""
    size = os.fstat(seg).st_size
    m = mmap.mmap(seg, size)
    capacity, _slot_size, slots = struct.unpack_from("<III", m, 24)
    s2c = HEADER + (size - HEADER) // 2
    data = round_up(768 + 12 * slots, 1024)
    head = struct.unpack_from("<Q", m, s2c)[0]
    struct.pack_into("<I", m, s2c + 12, capacity)
    struct.pack_into("<Q", m, s2c, head + capacity)
    struct.pack_into("<I", m, s2c + 8, 1)  # FIN
    ring(m, CLIENT_WAITING, ctl)
    end = time.time() + 20
    while time.time() < end and struct.unpack_from("<Q", m, s2c + 128)[0] < head + capacity:
        time.sleep(0.05)
    time.sleep(0.5)
    total = allocated(seg, s2c + data, size)
    print("READ %d of %d" % (struct.unpack_from("<Q", m, s2c + 128)[0] - head, capacity), flush=True)
    print("ALLOCATED %d" % (total >> 20), flush=True)


def hold(seconds):
    """Sleeps `seconds`, or less: until the file named by the environment's LEAVE exists (the
    test makes it once its checks of what the server does while we hold are done)."""
    leave, end = os.environ.get("LEAVE"), time.time() + seconds
    while time.time() < end and not (leave and os.path.exists(leave)):
        time.sleep(0.05)


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# The segment header's size (spec/WIRE.md section 4): the client->server block follows it.
HEADER = 1024


def round_up(v, a):
    return (v + a - 1) // a * a


def segment_size(ring, slot_size, slots):
    data_off = round_up(768 + 12 * slots, 1024)
    pool_off = round_up(data_off + ring, 4096)
    block = round_up(pool_off + slots * slot_size, 4096)
    return HEADER + 2 * block


def addr_record(ip, port):
    return struct.pack("<HH", 4, port) + socket.inet_aton(ip) + bytes(12) + bytes(4)


def header(ring, slot_size, slots, claim, client, server):
    h = b"COLOSEG\0" + struct.pack("<IIQIIIIII", 1, HEADER, segment_size(ring, slot_size, slots), ring, slot_size, slots,
                                    claim, os.getpid(), 0)
    return h + addr_record(*client) + addr_record(*server)


def make_segment(ring, slot_size, slots, claim, client, server, seal=True):
    """A memfd laid out as a segment with the given geometry and header (sparse)."""
    fd = os.memfd_create("colo-seg", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, segment_size(ring, slot_size, slots))
    os.pwrite(fd, header(ring, slot_size, slots, claim, client, server), 0)
    # Both rings start at 2048 bytes (spec/WIRE.md section 5), as an honest client's do.
    block = (segment_size(ring, slot_size, slots) - HEADER) // 2
    for base in (HEADER, HEADER + block):
        os.pwrite(fd, struct.pack("<I", 2048), base + 12)
    if seal:
        fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW)
    return fd


def carrier_offer(ring, port, slot_size=0, slots=0):
    """A CARRIER offer of a segment with rings of `ring` bytes (and a pool of `slots` slots of
    `slot_size` bytes) to the server at 127.0.0.1:PORT, from a TCP socket on an odd port (the
    only kind a server looks up offers for): returns (the TCP socket, connected; the rendezvous
    connection, its HELLO sent; the memfd)."""
    while True:
        t = socket.socket()
        t.bind(("127.0.0.1", 0))
        if t.getsockname()[1] % 2:
            break
        t.close()
    fd = make_segment(ring, slot_size, slots, CLAIM_OFFERED, t.getsockname(), ("127.0.0.1", port))
    ctl = rendezvous(port)
    socket.send_fds(ctl, [message(HELLO, CARRIER)], [fd])
    t.connect(("127.0.0.1", port))
    return t, ctl, fd


def message(kind, mode=0):
    return struct.pack("<IBBBxII", MSG_MAGIC, kind, 1, mode, 0, 0)


def welcomed_carriers(ring, port, n, slot_size=0, slots=0):
    """Up to `n` CARRIER offers of `carrier_offer` that the server welcomed, each as (the TCP
    socket, the rendezvous connection, the memfd, its mapping); stops at the first other answer,
    which it prints."""
    conns = []
    for _ in range(n):
        t, ctl, fd = carrier_offer(ring, port, slot_size, slots)
        a = answer(ctl)
        if a != "WELCOME":
            print("answer", a, flush=True)
            break
        conns.append((t, ctl, fd, mmap.mmap(fd, segment_size(ring, slot_size, slots))))
    return conns


def rendezvous(port):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(b"\0colo/1/127.0.0.1:%d" % port)
    return s


def doorbells():
    """The connection's doorbell pair (spec/WIRE.md section 1): (client's end, server's end)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setblocking(False)
    b.setblocking(False)
    return a.detach(), b.detach()


def hello(sock, mode, memfd, bells):
    # The segment alone: the control socket is the doorbell (spec/WIRE.md section 3). `bells`
    # stands for the descriptors a client holds beside it (kept as long as its connection).
    socket.send_fds(sock, [message(HELLO, mode)], [memfd])


def answer(sock, timeout=5.0):
    """'WELCOME', 'REJECT(<reason>)', 'CLOSED' or 'TIMEOUT'."""
    sock.settimeout(timeout)
    try:
        b = sock.recv(64)
    except (socket.timeout, BlockingIOError):
        return "TIMEOUT"
    except OSError:
        return "CLOSED"
    finally:
        sock.settimeout(None)
    if len(b) != 16:
        return "CLOSED"
    _, kind, _, arg = struct.unpack_from("<IBBB", b)
    if kind == WELCOME:
        return "WELCOME"
    if kind == REJECT:
        return "REJECT(%s)" % REASONS.get(arg, arg)
    return "CLOSED"


def hangup_futex(port, n):
    """Opens n DIRECT connections, waits until the server's thread sleeps on each futex, stores 0
    into every server_waiting word, hangs up everything."""
    raise_nofile()
    conns = []
    for _ in range(n):
        fd = make_segment(4096, 0, 0, CLAIM_DIRECT, ("127.0.0.1", 0), ("127.0.0.1", port))
        bells = doorbells()
        s = rendezvous(port)
        hello(s, DIRECT, fd, bells)
        a = answer(s)
        if a != "WELCOME":
            print("RESULT welcomed=%d answer=%s" % (len(conns), a))
            return 1
        m = mmap.mmap(fd, segment_size(4096, 0, 0), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        conns.append((s, fd, bells, m))
    # The server's echo threads read, find nothing and go to sleep on their futex.
    deadline = time.time() + 10
    asleep = 0
    while time.time() < deadline:
        asleep = sum(1 for c in conns if struct.unpack_from("<I", c[3], SERVER_WAITING)[0] & SLEEP_FUTEX)
        if asleep == n:
            break
        time.sleep(0.05)
    time.sleep(0.3)  # each sleeper is in FUTEX_WAIT (and registered with the hang-up watcher)
    for s, fd, bells, m in conns:
        struct.pack_into("<I", m, SERVER_WAITING, 0)
    for s, fd, bells, m in conns:
        s.close()
        m.close()
        os.close(fd)
        os.close(bells[0])
        os.close(bells[1])
    print("RESULT welcomed=%d asleep=%d" % (len(conns), asleep))
    return 0


def segment_flood(port, n, hold, small=0):
    """n DIRECT HELLOs that all hand over one sparse sealed memfd of the largest geometry the
    server takes (256 MiB), then `small` HELLOs with the smallest segment (filling what address
    space is left, so that the server's next thread cannot be had); keeps the welcomed ones open
    for `hold` seconds."""
    raise_nofile()
    ring, slot_size, slots = 64 << 20, 63 << 20, 1
    fd = make_segment(ring, slot_size, slots, CLAIM_DIRECT, ("127.0.0.1", 0), ("127.0.0.1", port))
    tiny = make_segment(4096, 0, 0, CLAIM_DIRECT, ("127.0.0.1", 0), ("127.0.0.1", port)) if small else None
    kept, answers = [], {}
    for i in range(n + small):
        if i == n:
            fd = tiny
        bells = doorbells()
        try:
            s = rendezvous(port)
            hello(s, DIRECT, fd, bells)
            a = answer(s)
        except OSError as e:
            a = "ERROR(%s)" % e.strerror
            s = None
        answers[a] = answers.get(a, 0) + 1
        if a == "WELCOME":
            kept.append((s, bells))
        else:
            if s:
                s.close()
            os.close(bells[0])
            os.close(bells[1])
    print("RESULT " + " ".join("%s=%d" % (k, v) for k, v in sorted(answers.items())), flush=True)
    time.sleep(hold)
    return 0


def oversize(port):
    """One DIRECT HELLO whose segment is just over 256 MiB (128 MiB rings): what the server
    answers."""
    fd = make_segment(128 << 20, 0, 0, CLAIM_DIRECT, ("127.0.0.1", 0), ("127.0.0.1", port))
    bells = doorbells()
    s = rendezvous(port)
    hello(s, DIRECT, fd, bells)
    print("RESULT size=%d answer=%s" % (segment_size(128 << 20, 0, 0), answer(s)))
    return 0


def half_handshakes(port, silent, offers, hold):
    """`silent` rendezvous connections that never send a HELLO, and `offers` CARRIER offers whose
    TCP connection never comes; everything is kept open for `hold` seconds (the server must let
    go of its side on its own timer)."""
    raise_nofile()
    held, answers = [], {}
    # Offers first: a listener that counts both kinds against one bound keeps offers then.
    for i in range(offers):
        fd = make_segment(4096, 0, 0, CLAIM_OFFERED, ("127.0.0.1", 20000 + i), ("127.0.0.1", port))
        bells = doorbells()
        try:
            s = rendezvous(port)
            hello(s, CARRIER, fd, bells)
            held.append(s)
        except OSError as e:
            k = "offer_%s" % e.strerror.replace(" ", "_")
            answers[k] = answers.get(k, 0) + 1
        os.close(fd)
        os.close(bells[0])
        os.close(bells[1])
    for _ in range(silent):
        try:
            held.append(rendezvous(port))
        except OSError as e:
            k = "connect_%s" % e.strerror.replace(" ", "_")
            answers[k] = answers.get(k, 0) + 1
    # What the server answered to the offers so far (REJECT beyond its bounds).
    for s in held:
        s.setblocking(False)
        try:
            b = s.recv(64)
            k = "closed" if len(b) == 0 else "REJECT(%s)" % REASONS.get(b[6], b[6]) if b[4] == REJECT else "other"
        except BlockingIOError:
            continue
        except OSError:
            k = "closed"
        answers[k] = answers.get(k, 0) + 1
    print("RESULT held=%d " % len(held) + " ".join("%s=%d" % (k, v) for k, v in sorted(answers.items())), flush=True)
    time.sleep(hold)
    return 0


def resize_loop(seconds):
    """Holds an unsealed memfd named colo-seg with a valid-looking header and keeps resizing it
    (what made a mapping `colo stat` took fault)."""
    big = segment_size(1 << 20, 0, 0)
    fd = make_segment(1 << 20, 0, 0, CLAIM_DIRECT, ("127.0.0.1", 1), ("127.0.0.1", 2), seal=False)
    end = time.time() + seconds
    n = 0
    while time.time() < end:
        os.ftruncate(fd, 4096)
        os.ftruncate(fd, big)
        os.pwrite(fd, header(1 << 20, 0, 0, CLAIM_DIRECT, ("127.0.0.1", 1), ("127.0.0.1", 2)), 0)
        n += 1
    print("RESULT resizes=%d" % n)
    return 0


def main(argv):
    cmd = argv[1]
    if cmd == "hangup_futex":
        return hangup_futex(int(argv[2]), int(argv[3]))
    if cmd == "segment_flood":
        return segment_flood(int(argv[2]), int(argv[3]), float(argv[4]), int(argv[5]) if len(argv) > 5 else 0)
    if cmd == "oversize":
        return oversize(int(argv[2]))
    if cmd == "half_handshakes":
        return half_handshakes(int(argv[2]), int(argv[3]), int(argv[4]), float(argv[5]))
    if cmd == "resize_loop":
        return resize_loop(float(argv[2]))
    print("usage: colo_attack.py hangup_futex PORT N | segment_flood PORT N HOLD | "
          "half_handshakes PORT SILENT OFFERS HOLD | resize_loop SECONDS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
