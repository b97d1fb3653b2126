"""Run as nobody by t_rt_client_holes.sh: a hostile colo server on 127.0.0.1:PORT (its own TCP
listener and rendezvous, so that root's clients trust it: spec/WIRE.md section 2) that answers
one client's HELLO (DIRECT or CARRIER) with WELCOME, then claims, in the ring toward the client,
a whole ring of bytes it never writes (holes) and FIN. The client's reads of them make the
kernel allocate those pages of the client's memfd, charged to the client. Once the client has
read them (its ring_tail) and hung up, the server keeps the memfd and prints
"ALLOCATED <while> <after>": KiB allocated in the server-to-client block while connected and
3 s after the hang-up (SEEK_DATA; what stays is charged to root's client for as long as this
process keeps the memfd).
Usage: hole_server.py PORT"""
import mmap
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402

port = int(sys.argv[1])
tcp = socket.socket()
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("127.0.0.1", port))
tcp.listen(8)
rv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
rv.bind(b"\0colo/1/127.0.0.1:%d" % port)
rv.listen(8)
print("LISTENING", flush=True)
rv.settimeout(30)
ctl, _ = rv.accept()
ctl.settimeout(5)
msg, fds, _, _ = socket.recv_fds(ctl, 64, 4)
kind, mode = msg[4], msg[6]
if kind != ca.HELLO or len(fds) != 1:
    print("RESULT no HELLO with one descriptor: %r %d" % (msg, len(fds)), flush=True)
    sys.exit(1)
fd = fds[0]
size = os.fstat(fd).st_size
m = mmap.mmap(fd, size)
capacity, slot_size, slots = struct.unpack_from("<III", m, 24)
block = (size - ca.HEADER) // 2
S2C = ca.HEADER + block
DATA = ca.round_up(768 + 12 * slots, 1024)
conn = None
if mode == ca.CARRIER:
    tcp.settimeout(5)
    conn, _ = tcp.accept()
    struct.pack_into("<I", m, 36, 2)  # claim: CLAIMED
struct.pack_into("<I", m, 44, os.getpid())
ctl.send(ca.message(ca.WELCOME))


def kib():
    """KiB of pages allocated in the server-to-client block from its ring data on."""
    return ca.allocated(fd, S2C + DATA, size) >> 10


# A whole ring of holes, then FIN: the client reads them all, then end of stream.
struct.pack_into("<I", m, S2C + 12, capacity)
struct.pack_into("<Q", m, S2C, capacity)
struct.pack_into("<I", m, S2C + 8, 1)
ca.ring(m, ca.CLIENT_WAITING, ctl)
end = time.time() + 20
while time.time() < end and struct.unpack_from("<Q", m, S2C + 128)[0] < capacity:
    time.sleep(0.05)
tail = struct.unpack_from("<Q", m, S2C + 128)[0]
during = kib()
# Until the client hangs up (its last close).
ctl.settimeout(20)
try:
    while ctl.recv(64):
        pass
except OSError:
    pass
time.sleep(3)
print("READ %d of %d" % (tail, capacity), flush=True)
print("ALLOCATED %d %d" % (during, kib()), flush=True)
m.close()
