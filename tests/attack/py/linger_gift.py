"""Run as nobody by t_rt_linger_gift.sh: hands root's colo server a descriptor whose last close
waits: a TCP socket with SO_LINGER {1, LINGER} and bytes it cannot send (its peer, which this
process keeps, never reads), passed with SCM_RIGHTS and then closed here, so that whoever drops
the passed reference last (the kernel does, in the receiving thread, when a receive without a
control buffer discards it, or when a socket whose queue holds it is closed) waits in close for
up to LINGER seconds.
Where: "bell" sends it with a ring on the control socket of an accepted CARRIER connection (the
doorbell: spec/WIRE.md section 6) and rings; "control" sends it with a datagram that is no ring
(a protocol error the server reads); "hello" puts it in the HELLO's segment slot (refused);
"bell_early" queues 20 with rings on the control socket before the HELLO and "control_early" one
right behind the HELLO, and then hangs up (the server closes the connection with them queued). Prints "GIVEN <where>" once done, then holds everything for HOLD seconds.
Usage: linger_gift.py PORT WHERE LINGER HOLD"""
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doorbell_attacker as da  # noqa: E402

port, where, linger, hold = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
keep = []


def lingering():
    return da.lingering(keep, linger)


def unlinger(t):
    t.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 0, 0))


def rights(fd):
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))]


def carrier_conn(bell_gifts=0, control_gift=False):
    """A CARRIER connection made by hand: `bell_gifts` gifts queued with rings on the control
    socket before the HELLO (a server that set SO_PASSRIGHTS after it is still handed those), and
    a gift datagram right behind the HELLO if `control_gift`."""
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for host in ("127.0.0.1", "0.0.0.0", "[::]"):
        try:
            ctl.connect(b"\0colo/1/%s:%d" % (host.encode(), port))
            break
        except ConnectionRefusedError:
            continue
    while True:
        tcp = socket.socket()
        tcp.bind(("127.0.0.1", 0))
        if tcp.getsockname()[1] % 2 == 1:
            break
        tcp.close()
    memfd, m = da.segment(da.OFFERED, tcp.getsockname(), ("127.0.0.1", port))
    ours = ctl
    for _ in range(bell_gifts):
        t = lingering()
        try:
            ours.sendmsg([b"r"], rights(t.fileno()))
        except OSError as e:
            print("refused", e, flush=True)  # the server refused the first and closed
            unlinger(t)
        t.close()
    try:
        socket.send_fds(ctl, [da.hello(da.CARRIER)], [memfd])
    except OSError as e:
        print("HELLO not sent:", e, flush=True)
    if control_gift:
        t = lingering()
        try:
            ctl.sendmsg([b"x"], rights(t.fileno()))
        except OSError as e:
            print("refused", e, flush=True)  # the server read the HELLO and refuses rights
            unlinger(t)
        t.close()
    tcp.connect(("127.0.0.1", port))
    keep.extend([memfd, m, tcp])
    return ctl, ours, m


if where in ("bell_early", "control_early"):
    ctl, ours, m = carrier_conn(bell_gifts=20 if where == "bell_early" else 0, control_gift=where == "control_early")
    print("answer", da.answer(ctl), flush=True)
    # Make the server look at its doorbell, then hang up: it closes the connection, with what
    # is queued on its doorbell and control socket.
    struct.pack_into("<I", m, da.SERVER_WAITING, 0)
    try:
        ours.send(b"r", socket.MSG_DONTWAIT)
    except OSError:
        pass  # refused: the server closed its end
    time.sleep(0.5)
    ctl.close()
elif where in ("bell", "control"):
    c = da.Conn(port, da.CARRIER, "control")
    a = da.answer(c.ctl)
    print("answer", a, flush=True)
    keep.append(c)
    t = lingering()
    try:
        if where == "bell":
            c.ours.sendmsg([b"r"], rights(t.fileno()))
            # The server looks at its doorbell when it is told to: ring.
            c.ring_server()
        else:
            c.ctl.sendmsg([b"x"], rights(t.fileno()))
    except OSError as e:
        print("refused", e, flush=True)  # SO_PASSRIGHTS: the gift never reaches the server
        unlinger(t)  # our own copy is then the last one
    t.close()
elif where == "hello":
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for host in ("127.0.0.1", "0.0.0.0", "[::]"):
        try:
            ctl.connect(b"\0colo/1/%s:%d" % (host.encode(), port))
            break
        except ConnectionRefusedError:
            continue
    keep.append(ctl)
    t = lingering()
    socket.send_fds(ctl, [da.hello(da.CARRIER)], [t.fileno()])
    t.close()
    print("answer", da.answer(ctl), flush=True)
print("GIVEN", where, flush=True)
time.sleep(hold)
