#!/usr/bin/python3
"""A colo client that abuses its doorbell (issue 21, finding 4), run as nobody by t_doorbell.sh.

It speaks the handshake (spec/WIRE.md sections 3-4) to the colo listener at 127.0.0.1:PORT,
DIRECT (falling back to CARRIER when told NEED_CARRIER) or CARRIER. The doorbell is the control
socket itself (section 6): it first offers the doorbells of the older wires, which the server
must refuse (a HELLO with three descriptors: one Unix stream socket pair's end twice, or two
eventfds), then the current HELLO, and does everything it can to the control socket while it
makes the server ring it (it announces a doorbell sleep and sends a request the server
answers): its end made blocking, the server's queue filled with rings, descriptors sent along,
the server's rings read, and at the end a datagram that is no ring and its end shut down.

Usage: doorbell_attacker.py PORT direct|carrier REQUEST EXPECTED_PREFIX SECONDS
Prints one line per step; exits 0 once it is done with the connection (whatever the server did).
"""
import ctypes
import fcntl
import mmap
import os
import socket
import struct
import sys
import time

MAGIC = 0x4F4C4F43
HELLO, WELCOME, REJECT = 1, 2, 3
DIRECT, CARRIER = 1, 2
BAD_MESSAGE, NEED_CARRIER = 1, 4
OFFERED, CLAIM_DIRECT = 1, 0
RING = 65536
# A direction block without a pool (spec/WIRE.md section 4): the ring data at round_up(768, 1024),
# the block rounded up to pages.
DATA_OFF = 1024
HEADER = 1024
BLOCK = 4096 + RING
SIZE = HEADER + 2 * BLOCK
C2S, S2C = HEADER, HEADER + BLOCK
CLIENT_WAITING, SERVER_WAITING = 128, 256
LIBC = ctypes.CDLL(None, use_errno=True)
F_ADD_SEALS, F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW = 1033, 1, 2, 4


def say(*a):
    print("attacker:", *a, flush=True)


def addr_record(ip, port):
    return struct.pack("<HH16sI", 4, port, socket.inet_aton(ip) + bytes(12), 0)


def segment(claim, client, server):
    fd = os.memfd_create("colo-seg", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, SIZE)
    m = mmap.mmap(fd, SIZE)
    head = struct.pack("<8sIIQIIIIII", b"COLOSEG\0", 1, HEADER, SIZE, RING, 0, 0, claim, os.getpid(), 0)
    m[0:len(head)] = head
    m[48:72] = addr_record(*client) if client else bytes(24)
    m[72:96] = addr_record(*server)
    # Both rings start at 2048 bytes (spec/WIRE.md section 5), as an honest client's do.
    for base in (C2S, S2C):
        m[base + 12:base + 16] = struct.pack("<I", 2048)
    fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
    return fd, m


def hello(mode):
    return struct.pack("<IBBBBII", MAGIC, HELLO, 1, mode, 0, 0, 0)


def answer(ctl, timeout=5.0):
    ctl.settimeout(timeout)
    try:
        b = ctl.recv(64)
    except socket.timeout:
        return None
    if len(b) != 16:
        return ("closed", 0)
    magic, typ, ver, arg = struct.unpack_from("<IBBB", b)
    return ({WELCOME: "welcome", REJECT: "reject"}.get(typ, "?"), arg)


def lingering(keep, linger):
    """A TCP socket whose close waits up to `linger` s: unsent bytes to a peer that never reads
    (its listener and peer end go into `keep`)."""
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(1)
    t = socket.socket()
    t.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    t.connect(l.getsockname())
    peer, _ = l.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    keep.extend([l, peer])
    t.setblocking(False)
    try:
        while True:
            t.send(b"x" * 65536)
    except BlockingIOError:
        pass
    t.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, linger))
    return t


def blocking(fd):
    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~os.O_NONBLOCK)


class Conn:
    """One attempt: control socket, segment, doorbells (kept), carrier TCP socket."""

    def __init__(self, port, mode, kind):
        """kind: "control" (the current wire), "socket" or "eventfd" (older doorbells)."""
        self.port, self.mode, self.kind = port, mode, kind
        # The rendezvous lookup of spec section 2: the address, then the wildcards.
        for host in ("127.0.0.1", "0.0.0.0", "[::]"):
            self.ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                self.ctl.connect(b"\0colo/1/%s:%d" % (host.encode(), port))
                break
            except ConnectionRefusedError:
                self.ctl.close()
        else:
            raise ConnectionRefusedError("no rendezvous for port %d" % port)
        self.tcp = None
        client = None
        if mode == CARRIER:
            while True:  # an odd local port: the only kind a server looks up offers for
                self.tcp = socket.socket()
                self.tcp.bind(("127.0.0.1", 0))
                if self.tcp.getsockname()[1] % 2 == 1:
                    break
                self.tcp.close()
            client = self.tcp.getsockname()
        self.memfd, self.m = segment(OFFERED if mode == CARRIER else CLAIM_DIRECT,
                                     client or ("127.0.0.1", 0), ("127.0.0.1", port))
        if kind == "control":
            self.ours = self.theirs = self.ctl
            bells = []
        elif kind == "socket":
            self.ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            bells = [self.theirs.fileno(), self.theirs.fileno()]
        else:
            self.ours = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)  # client's: server rings
            self.theirs = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)  # server's: it drains
            bells = [self.ours, self.theirs]
        socket.send_fds(self.ctl, [hello(mode)], [self.memfd] + bells)
        if self.tcp:
            self.tcp.connect(("127.0.0.1", port))

    def fd(self, x):
        return x if isinstance(x, int) else x.fileno()

    def attack_bells(self):
        # Python's own timeout off (it would poll before each MSG_DONTWAIT call), then the
        # description made blocking: the server's end must not care.
        self.ctl.settimeout(None)
        blocking(self.ctl.fileno())
        # The server's queue filled with rings: its drains take one at a time, and its rings to
        # us still go out (our own queue is the server's send buffer, which we never read here).
        n = 0
        try:
            while n < 100_000:
                self.ctl.send(b"r", socket.MSG_DONTWAIT)
                n += 1
        except (BlockingIOError, OSError):
            pass
        # Descriptors along with rings (the server refuses them, SO_PASSRIGHTS; it must never
        # install them either way).
        gift = os.eventfd(0)
        sent = 0
        for _ in range(4):
            try:
                self.ctl.sendmsg([b"r"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", gift))],
                                 socket.MSG_DONTWAIT)
                sent += 1
            except OSError:
                break
        os.close(gift)
        say(f"control doorbell made blocking, {n} rings stuffed into the server's queue, {sent} descriptors sent")

    def ring_server(self):
        # Wake the server the way its waiting word asks (spec section 6): bit 1 futex, bit 0 doorbell.
        w = struct.unpack_from("<I", self.m, SERVER_WAITING)[0]
        struct.pack_into("<I", self.m, SERVER_WAITING, 0)
        if w & 2:
            addr = ctypes.addressof(ctypes.c_char.from_buffer(self.m, SERVER_WAITING))
            LIBC.syscall(202, ctypes.c_void_p(addr), 1, 0x7FFFFFFF, None, None, 0)  # FUTEX_WAKE
        try:
            self.ctl.send(b"r", socket.MSG_DONTWAIT)
        except OSError:
            pass

    def read_rings(self):
        """Reads what the server rang us with (its rings are ours to read)."""
        got = 0
        try:
            while True:
                b = self.ctl.recv(64, socket.MSG_DONTWAIT)
                if not b:
                    break
                got += len(b)
        except OSError:
            pass
        return got

    def request(self, req, seconds):
        """Announces a doorbell sleep, writes req into C2S, rings; waits for the reply."""
        m = self.m
        head = struct.unpack_from("<Q", m, C2S)[0]
        for i, c in enumerate(req):
            m[C2S + DATA_OFF + (head + i) % RING] = c
        struct.pack_into("<I", m, CLIENT_WAITING, struct.unpack_from("<I", m, CLIENT_WAITING)[0] | 1)
        struct.pack_into("<Q", m, C2S, head + len(req))
        self.ring_server()
        deadline = time.time() + seconds
        tail = struct.unpack_from("<Q", m, S2C + 128)[0]
        while time.time() < deadline:
            # Keep asking for rings: the server must ring us on each reply.
            struct.pack_into("<I", m, CLIENT_WAITING, struct.unpack_from("<I", m, CLIENT_WAITING)[0] | 1)
            h = struct.unpack_from("<Q", m, S2C)[0]
            if h != tail:
                out = bytes(m[S2C + DATA_OFF + (tail + i) % RING] for i in range(min(h - tail, 256)))
                struct.pack_into("<Q", m, S2C + 128, h)
                return out
            time.sleep(0.01)
        return None


def main():
    port, how, req, expect, seconds = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode(), sys.argv[4].encode(), float(sys.argv[5])
    req = req.decode("unicode_escape").encode("latin-1")
    mode = CARRIER if how == "carrier" else DIRECT
    conn = None
    for kind in ("socket", "eventfd", "control"):
        c = Conn(port, mode, kind)
        a = answer(c.ctl)
        if a == ("reject", NEED_CARRIER) and mode == DIRECT:
            say("DIRECT refused (NEED_CARRIER): CARRIER instead")
            mode = CARRIER
            c = Conn(port, mode, kind)
            a = answer(c.ctl)
        say(f"{kind} doorbells: {a}")
        if a and a[0] == "welcome" and kind != "control":
            say(f"the server took {kind} doorbells of an older wire")
            return
        if a and a[0] == "welcome":
            conn = c
            break
        if a != ("reject", BAD_MESSAGE):
            say("no connection")
            return
    if conn is None:
        say("no connection")
        return
    conn.attack_bells()
    for i in range(3):
        out = conn.request(req, seconds / 3)
        say(f"reply {i}: {out!r} (expected {expect!r}), server rang {conn.read_rings()} bytes")
        if out is None:
            break
        # Refill what the server's drains emptied (bounded: a server that drains as fast as we
        # ring keeps the queue from ever filling).
        try:
            for _ in range(10_000):
                conn.ctl.send(b"r", socket.MSG_DONTWAIT)
        except OSError:
            pass
    # A datagram that is no ring (the server resets the connection), then our end shut down:
    # to the server, a hang-up.
    try:
        conn.ctl.send(b"garbage", socket.MSG_DONTWAIT)
    except OSError:
        pass
    conn.ctl.shutdown(socket.SHUT_RDWR)
    say("doorbell shut down")
    time.sleep(0.5)
    say("leaving")


if __name__ == "__main__":
    main()
