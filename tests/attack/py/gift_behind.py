#!/usr/bin/python3
"""Run as nobody by t_rt_gift_behind.sh: makes root's colo server close a rendezvous connection
with a lingering TCP socket (SO_LINGER {1, LINGER}, bytes its peer, kept here, never reads)
still queued on it, so that the close releases it in the server's thread, which then waits up
to LINGER seconds (see tests/attack/py/linger_gift.py). Right after connecting to the
rendezvous it queues, in one sendmmsg (before the server reads anything, and so before the
socket refuses descriptors), datagrams that make the server refuse the connection, then four
datagrams each carrying its own lingering socket, and closes its copies at once:
  zero  a ring, then a zero-length datagram, which the server's emptying took for the end;
  many  80 rings, more than the server emptied (64) before its close; 80 other rendezvous
        connections, each with a datagram of 253 descriptors to close, go first, so that the
        server reads this one only once everything is queued;
  nested a HELLO whose one descriptor is no memfd but a Unix socket (SOCK_SEQPACKET) holding
        a zero-length datagram and then one lingering socket (the server takes what it
        holds as it receives it, and stopped at the zero-length datagram).
Prints "GIVEN <n> gifts" (0: the server read too early and refused them; try again), then holds
everything for HOLD seconds.
Usage: gift_behind.py PORT zero|many|nested LINGER HOLD"""
import ctypes
import os
import resource
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doorbell_attacker as da  # noqa: E402

LIBC = ctypes.CDLL(None, use_errno=True)
MSG_NOSIGNAL = 0x4000


class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint), ("iov", ctypes.POINTER(iovec)),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", msghdr), ("len", ctypes.c_uint)]


def rendezvous(port):
    for host in ("127.0.0.1", "0.0.0.0", "[::]"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(b"\0colo/1/%s:%d" % (host.encode(), port))
            return s
        except ConnectionRefusedError:
            s.close()
    raise ConnectionRefusedError(port)


port, how, linger, hold = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
keep = []
if how == "nested":
    t = da.lingering(keep, linger)
    x, y = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    y.send(b"")
    socket.send_fds(y, [b"r"], [t.fileno()])
    os.close(t.detach())
    ctl = rendezvous(port)
    socket.send_fds(ctl, [da.hello(da.CARRIER)], [x.fileno()])
    os.close(x.detach())  # the server's copy is now the last one
    y.close()
    print("GIVEN 1 gifts", flush=True)
    time.sleep(hold)
    sys.exit(0)
gifts = [da.lingering(keep, linger) for _ in range(4)]
plain = 2 if how == "zero" else 80
byte = ctypes.create_string_buffer(b"r", 1)
ring = iovec(ctypes.cast(byte, ctypes.c_void_p), 1)
empty = iovec(ctypes.cast(byte, ctypes.c_void_p), 0)
msgs = (mmsghdr * (plain + len(gifts)))()
controls = []
for i in range(len(msgs)):
    msgs[i].hdr.iov = ctypes.pointer(empty if how == "zero" and i == 1 else ring)
    msgs[i].hdr.iovlen = 1
    if i >= plain:
        # struct cmsghdr { size_t len; int level; int type; } and one int, padded to 8 bytes.
        c = ctypes.create_string_buffer(struct.pack("QiiiI", 20, socket.SOL_SOCKET, socket.SCM_RIGHTS, gifts[i - plain].fileno(), 0), 24)
        controls.append(c)
        msgs[i].hdr.control = ctypes.cast(c, ctypes.c_void_p)
        msgs[i].hdr.controllen = 24
fillers = []
if how == "many":
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    ev = os.eventfd(0)
    for _ in range(80):
        s = rendezvous(port)
        try:
            s.sendmsg([b"r"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("253i", *([ev] * 253)))], socket.MSG_DONTWAIT)
        except OSError:
            break  # the kernel's limit of descriptors in flight
        fillers.append(s)
ctl = rendezvous(port)
n = LIBC.sendmmsg(ctl.fileno(), msgs, len(msgs), MSG_NOSIGNAL)
for g in gifts:
    os.close(g.detach())  # the server's queued copies are now the last ones
print(f"GIVEN {max(0, n - plain)} gifts", flush=True)
time.sleep(hold)
