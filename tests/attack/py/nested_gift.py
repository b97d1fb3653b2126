"""Run as nobody by t_rt_nested_gift.sh: gets a lingering TCP socket's last close into a thread of
root's colo server, past SO_PASSRIGHTS and past the disarming of what the server receives.

It sends a Unix socket U whose receive queue holds T: a TCP socket with SO_LINGER {1, LINGER}
and bytes its peer (kept here, never reading) cannot take. T's own copy and U's are closed here,
so the server's reference to U would be the last one, and U's only reference to T too: a server
that closed U undisarmed would wait out T's linger in that thread. The doorbell is the control
socket (spec/WIRE.md section 6), whose server end this client never holds, so once the server
read the HELLO (and turned SO_PASSRIGHTS off) nothing can be passed at all; before, the server
must empty U before its close.
WHERE:
  nested  U with a ring on the control socket of a welcomed connection (refused), then a ring;
  deep    the same, U the top of a chain of 40 Unix sockets, each in the queue of the one above,
          with T at the bottom;
  early   U queued with a ring on the control socket before the HELLO (descriptors are still on
          then), the TCP connection made (the server refuses the HELLO behind it);
  slot    U in the HELLO's segment slot (refused);
  expire  a HELLO whose TCP connection never comes, then U sent behind it (refused); the offer
          expires (5 s) and is dropped.
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
    """U, holding T in its queue (through a chain for "deep"), and T itself, still open here."""
    t = lingering()
    u = chain(os.dup(t.fileno()), 40 if where == "deep" else 1)
    return u, t


def drop(u, t, given):
    """Closes our references: if the gift was not given, T's lingering is turned off first (our
    own close of U would otherwise be the last one, and wait here)."""
    if not given:
        t.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 0, 0))
    t.close()
    u.close()


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


def give(sock, u, t):
    try:
        sock.sendmsg([b"r"], rights(u.fileno()))
        given = True
    except OSError as e:
        print("refused", e, flush=True)  # SO_PASSRIGHTS, or a closed connection: never reaches the server
        given = False
    drop(u, t, given)


if where in ("nested", "deep"):
    c = da.Conn(port, da.CARRIER, "control")
    print("answer", da.answer(c.ctl), flush=True)
    keep.append(c)
    print("passrights as the server left it: not ours to see (its own end)", flush=True)
    give(c.ctl, *gift())
    c.ring_server()
elif where in ("early", "slot", "expire"):
    ctl = rendezvous()
    tcp = odd_port_socket()
    memfd, m = da.segment(da.OFFERED, tcp.getsockname(), ("127.0.0.1", port))
    keep.extend([ctl, tcp, memfd, m])
    if where == "early":
        give(ctl, *gift())
    if where == "slot":
        u, t = gift()
        socket.send_fds(ctl, [da.hello(da.CARRIER)], [u.fileno()])
        drop(u, t, True)
        print("answer", da.answer(ctl), flush=True)
    else:
        try:
            socket.send_fds(ctl, [da.hello(da.CARRIER)], [memfd])
        except OSError as e:
            print("HELLO not sent:", e, flush=True)  # the server refused what came first and closed
    if where == "early":
        tcp.connect(("127.0.0.1", port))
        print("answer", da.answer(ctl), flush=True)
    if where == "expire":
        time.sleep(0.5)  # the server reads the HELLO at once
        give(ctl, *gift())
        time.sleep(6)  # the offer's 5 s
print("GIVEN", where, flush=True)
time.sleep(hold)
