"""Run as nobody by t_rt_nested_gift.sh: gets a lingering TCP socket's last close into a thread of
root's colo server, past SO_PASSRIGHTS and past the disarming of what the server receives.

The server's doorbell end is a socket this client made and handed over in its HELLO. The client
keeps a copy of it, so after the server turned SO_PASSRIGHTS off on it, the client turns it back
on (any holder of a socket may set its options). It then sends, on its own end, a Unix socket U
whose receive queue holds T: a TCP socket with SO_LINGER {1, LINGER} and bytes its peer (kept
here, never reading) cannot take. T's own copy and U's are closed here, so the server's
reference to U is the last one, and U's only reference to T too. The server's drain receives U
and disarms it (lingering off: U is a Unix socket, that changes nothing for T) and closes it;
U's release empties its queue, and T's last close then waits out its linger in that thread.
WHERE:
  nested  U on the doorbell of a welcomed connection, then a ring (the server drains it);
  deep    the same, U the top of a chain of 40 Unix sockets, each in the queue of the one above,
          with T at the bottom (more than the drain empties in its own thread);
  early   U queued on the doorbell before the HELLO (descriptors are still on then), the TCP
          connection made (the server takes the doorbell's queue when it claims the offer);
  slot    U in the HELLO's segment slot (refused);
  expire  a HELLO whose TCP connection never comes; once the server read it, descriptors turned
          back on through the kept copy, U queued, the copy closed: the offer expires (5 s) and
          is dropped.
Prints "GIVEN <where>" when done, then holds everything for HOLD seconds.
Usage: nested_gift.py PORT WHERE LINGER HOLD"""
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doorbell_attacker as da  # noqa: E402

SO_PASSRIGHTS = 83
port, where, linger, hold = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
keep = []


def lingering():
    return da.lingering(keep, linger)


def rights(fd):
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))]


def holding(fd):
    """A Unix socket whose receive queue holds `fd` (closed here): only its release drops it."""
    u, w = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    w.sendmsg([b"x"], rights(fd))
    w.close()
    return u




def chain(fd, depth):
    """`fd` (closed here) at the bottom of `depth` Unix sockets, each queued in the next."""
    for _ in range(depth):
        u = holding(fd)
        os.close(fd)
        fd = os.dup(u.fileno())
        u.close()
    return socket.socket(fileno=fd)


def gift():
    t = lingering()
    u = chain(os.dup(t.fileno()), 40 if where == "deep" else 1)
    t.close()
    return u


def rendezvous():
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for host in ("127.0.0.1", "0.0.0.0", "[::]"):
        try:
            ctl.connect(b"\0colo/1/%s:%d" % (host.encode(), port))
            return ctl
        except ConnectionRefusedError:
            continue
    raise ConnectionRefusedError("no rendezvous")


def odd_port_socket():
    while True:
        tcp = socket.socket()
        tcp.bind(("127.0.0.1", 0))
        if tcp.getsockname()[1] % 2 == 1:
            return tcp
        tcp.close()


if where in ("nested", "deep"):
    c = da.Conn(port, da.CARRIER, "socket")
    print("answer", da.answer(c.ctl), flush=True)
    keep.append(c)
    print("passrights as the server left it:", c.theirs.getsockopt(socket.SOL_SOCKET, SO_PASSRIGHTS), flush=True)
    c.theirs.setsockopt(socket.SOL_SOCKET, SO_PASSRIGHTS, 1)
    u = gift()
    c.ours.sendmsg([b"r"], rights(u.fileno()))
    u.close()
    c.theirs.close()  # the server's reference is the last one
    c.ring_server()
elif where in ("early", "slot", "expire"):
    ctl = rendezvous()
    tcp = odd_port_socket()
    memfd, m = da.segment(da.OFFERED, tcp.getsockname(), ("127.0.0.1", port))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    keep.extend([ctl, tcp, memfd, m, ours])
    if where == "early":
        u = gift()
        ours.sendmsg([b"r"], rights(u.fileno()))
        u.close()
    if where == "slot":
        u = gift()
        socket.send_fds(ctl, [da.hello(da.CARRIER)], [u.fileno(), theirs.fileno(), theirs.fileno()])
        u.close()
        theirs.close()
        print("answer", da.answer(ctl), flush=True)
    else:
        socket.send_fds(ctl, [da.hello(da.CARRIER)], [memfd, theirs.fileno(), theirs.fileno()])
    if where == "early":
        theirs.close()
        tcp.connect(("127.0.0.1", port))
        print("answer", da.answer(ctl), flush=True)
    if where == "expire":
        # The server reads the HELLO at once and turns descriptors off on its doorbell end.
        for _ in range(200):
            if theirs.getsockopt(socket.SOL_SOCKET, SO_PASSRIGHTS) == 0:
                break
            time.sleep(0.01)
        print("passrights as the server left it:", theirs.getsockopt(socket.SOL_SOCKET, SO_PASSRIGHTS), flush=True)
        theirs.setsockopt(socket.SOL_SOCKET, SO_PASSRIGHTS, 1)
        u = gift()
        ours.sendmsg([b"r"], rights(u.fileno()))
        u.close()
        theirs.close()
        time.sleep(6)  # the offer's 5 s
print("GIVEN", where, flush=True)
time.sleep(hold)
