"""Exec'd as nobody by py/exec_nobody_server.py (t_rt_exec_setuid.sh): the service of root's
inetd-like server, run as another user, with the client's connection on descriptor FD. A
service of another user must get a connection like a TCP socket's, nothing of the shared
memory behind it. It lists what it inherited: a segment memfd (/memfd:colo-seg) would give it
the rings of root's client, whose check of its peer's uid (SO_PEERCRED of the control socket:
root, who listened and accepted) says "same user", so the client reads its ring through the
mapping. With one, it claims a whole ring of bytes toward the client it never writes (holes)
and FIN, rings the client (its control socket, the inherited SEQPACKET socket), and prints
"ALLOCATED <MiB>": what the client's reads allocated of its memfd, charged to root's client.
Then, or without one (after it read the client's byte), it writes GREETING to its connection and closes it (what an honest
service does).
Usage: exec_nobody_service.py PORT FD (PORT: the server's)"""
import ctypes
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402

GREETING = b"hello from nobody's service\n"

fd, port = int(sys.argv[-1]), int(sys.argv[-2])
seg = ctl = None
for name in os.listdir("/proc/self/fd"):
    n = int(name)
    try:
        link = os.readlink("/proc/self/fd/%d" % n)
    except OSError:
        continue
    if link.startswith("/memfd:colo-seg"):
        seg = n
    elif link.startswith("socket:") and n != fd:
        try:
            t = socket.socket(fileno=n)
            kind = t.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
            t.detach()
        except OSError:
            continue
        if kind == socket.SOCK_SEQPACKET:
            ctl = n
print("INHERITED segment=%s control=%s uid=%d" % (seg, ctl, os.getuid()), flush=True)
if seg is None:
    # Or in a process of this uid that holds its mapping (the relay, forked by root's server
    # before the exec: its command line is the server's): its memory through /proc/PID/mem, its
    # descriptors through pidfd_getfd, both of which the kernel allows this uid if that process
    # is dumpable. Only a process of this test's server (its port) is looked at, and nothing is
    # written there: what could be opened or taken is printed ("PROCESS ...").
    libc0 = ctypes.CDLL(None, use_errno=True)
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            cmd = open("/proc/%s/cmdline" % p, "rb").read().split(b"\0")
            if not any(a.endswith(b"exec_nobody_server.py") for a in cmd) or str(port).encode() not in cmd:
                continue
            if "colo-seg" not in open("/proc/%s/maps" % p).read():
                continue
        except OSError:
            continue
        try:
            os.close(os.open("/proc/%s/mem" % p, os.O_RDWR))
            mem = "opened"
        except OSError as e:
            mem = "refused (%s)" % e.strerror
        try:
            first = min(int(n) for n in os.listdir("/proc/%s/fd" % p))
            got = libc0.syscall(438, os.pidfd_open(int(p)), first, 0)  # pidfd_getfd
            took = "taken" if got >= 0 else "refused"
        except OSError as e:
            took = "refused (%s)" % e.strerror
        print("PROCESS %s maps a segment: its memory %s, its descriptors %s" % (p, mem, took), flush=True)


if seg is not None:
    ca.claim_ring_toward_client(seg, ctl)
try:
    if seg is None:
        os.read(fd, 1)  # the client's byte (left unread, the close would reset the connection)
    os.write(fd, GREETING)
except OSError as e:
    print("write: %s" % e, flush=True)
os.close(fd)
time.sleep(1)
