"""Run as nobody by t_rt_odd_fds.sh: one HELLO per kind of odd descriptor, in the segment slot or
beside it (the doorbell slots of older wires: a HELLO carries the segment alone now), to the colo server at 127.0.0.1:PORT (CARRIER, as another user must; every
segment otherwise valid). Prints "CASE <name> <answer>" per case and "RESULT cases=N".
Usage: odd_fds.py PORT"""
import fcntl
import os
import socket
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doorbell_attacker as da  # noqa: E402

port = int(sys.argv[1])
F_ADD_SEALS, F_SEAL_WRITE, F_SEAL_FUTURE_WRITE = 1033, 8, 16


def carrier_tcp():
    while True:
        t = socket.socket()
        t.bind(("127.0.0.1", 0))
        if t.getsockname()[1] % 2 == 1:
            return t
        t.close()


def segment(tcp, extra_seals=0, seal=True):
    fd, m = da.segment(da.OFFERED, tcp.getsockname(), ("127.0.0.1", port)) if seal else unsealed(tcp)
    if extra_seals:
        try:
            fcntl.fcntl(fd, F_ADD_SEALS, extra_seals)
        except OSError:
            pass  # sealed with F_SEAL_SEAL already: made below without it
    return fd, m


def unsealed(tcp):
    fd = os.memfd_create("colo-seg", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, da.SIZE)
    return fd, None


def sealed_with(tcp, seals):
    """A segment sealed with exactly `seals` (F_SEAL_SEAL last, if in them)."""
    fd = os.memfd_create("colo-seg", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, da.SIZE)
    import mmap
    m = mmap.mmap(fd, da.SIZE)
    head = struct.pack("<8sIIQIIIIII", b"COLOSEG\0", 1, da.HEADER, da.SIZE, da.RING, 0, 0, da.OFFERED, os.getpid(), 0)
    m[0:len(head)] = head
    m[48:72] = da.addr_record(*tcp.getsockname())
    m[72:96] = da.addr_record("127.0.0.1", port)
    for base in (da.C2S, da.S2C):
        m[base + 12:base + 16] = struct.pack("<I", 2048)
    m.close()
    fcntl.fcntl(fd, F_ADD_SEALS, seals & ~da.F_SEAL_SEAL)
    if seals & da.F_SEAL_SEAL:
        fcntl.fcntl(fd, F_ADD_SEALS, da.F_SEAL_SEAL)
    return fd


def attempt(name, make):
    tcp = carrier_tcp()
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    keep = []
    try:
        ctl.connect(b"\0colo/1/127.0.0.1:%d" % port)
        fds = make(tcp, keep)
        socket.send_fds(ctl, [da.hello(da.CARRIER)], fds)
        tcp.connect(("127.0.0.1", port))
        a = da.answer(ctl, 5.0)
    except OSError as e:
        a = "error %s" % e
    print("CASE", name, a, flush=True)
    for k in keep:
        try:
            os.close(k) if isinstance(k, int) else k.close()
        except OSError:
            pass
    ctl.close()
    tcp.close()


def bells(keep):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    keep += [a, b]
    return b.fileno()


def seg(tcp, keep, **kw):
    fd, m = segment(tcp, **kw)
    keep.append(fd)
    return fd


SEALS = da.F_SEAL_SHRINK | da.F_SEAL_GROW | da.F_SEAL_SEAL
cases = {}


def case(f):
    cases[f.__name__] = f
    return f


@case
def honest(tcp, keep):
    return [seg(tcp, keep)]


@case
def pipe_as_segment(tcp, keep):
    r, w = os.pipe()
    keep += [r, w]
    return [r]


@case
def fifo_write_end_as_segment(tcp, keep):
    r, w = os.pipe()
    keep += [r, w]
    return [w]


@case
def o_path_memfd(tcp, keep):
    fd = seg(tcp, keep)
    p = os.open("/proc/self/fd/%d" % fd, os.O_PATH)
    keep.append(p)
    return [p]


@case
def read_only_memfd(tcp, keep):
    fd = seg(tcp, keep)
    p = os.open("/proc/self/fd/%d" % fd, os.O_RDONLY)
    keep.append(p)
    return [p]


@case
def write_sealed_memfd(tcp, keep):
    fd = sealed_with(tcp, SEALS | F_SEAL_WRITE)
    keep.append(fd)
    return [fd]


@case
def future_write_sealed_memfd(tcp, keep):
    fd = sealed_with(tcp, SEALS | F_SEAL_FUTURE_WRITE)
    keep.append(fd)
    return [fd]


@case
def seals_open_to_more(tcp, keep):
    fd = sealed_with(tcp, da.F_SEAL_SHRINK | da.F_SEAL_GROW)
    keep.append(fd)
    return [fd]


@case
def dev_zero_as_segment(tcp, keep):
    fd = os.open("/dev/zero", os.O_RDWR)
    keep.append(fd)
    return [fd]


@case
def directory_as_segment(tcp, keep):
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    keep.append(fd)
    return [fd]


@case
def listening_socket_as_doorbell(tcp, keep):
    l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    l.bind(b"\0colo-attack-%d" % os.getpid())
    l.listen(8)
    keep.append(l)
    # Readable for good once a connection waits in its backlog.
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(b"\0colo-attack-%d" % os.getpid())
    keep.append(c)
    return [seg(tcp, keep), l.fileno(), l.fileno()]


@case
def unconnected_socket_as_doorbell(tcp, keep):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    keep.append(s)
    return [seg(tcp, keep), s.fileno(), s.fileno()]


@case
def o_path_socket_as_doorbell(tcp, keep):
    l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = "/tmp/colo-attack-sock-%d" % os.getpid()
    l.bind(path)
    keep.append(l)
    p = os.open(path, os.O_PATH)
    keep.append(p)
    os.unlink(path)
    return [seg(tcp, keep), p, p]


@case
def dup_of_the_bell(tcp, keep):
    b = bells(keep)
    d = os.dup(b)
    keep.append(d)
    return [seg(tcp, keep), b, d]


@case
def half_shut_bell(tcp, keep):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    keep += [a, b]
    b.shutdown(socket.SHUT_RD)
    a.shutdown(socket.SHUT_WR)
    return [seg(tcp, keep), b.fileno(), b.fileno()]


@case
def four_descriptors(tcp, keep):
    b = bells(keep)
    return [seg(tcp, keep), b, b, b]


@case
def two_descriptors(tcp, keep):
    b = bells(keep)
    return [seg(tcp, keep), b]


for name, make in cases.items():
    attempt(name, make)
print("RESULT cases=%d" % len(cases), flush=True)
