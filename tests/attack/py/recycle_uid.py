"""Run as root by t_rt_recycle_uid.sh: a client process that changes uid between two DIRECT
connections to root's Rust API server (which opted in to DIRECT from any uid,
COLO_DIRECT_ANY_UID=1), recycling its segment for the second (spec/WIRE.md section 3,
"Recycling"). The first connection, from root, is same-user to the server, which reads its
ring through its mapping and keeps no memfd of it; it echoes "hi" and closes cleanly, and parks
the segment. The process then drops to nobody:nogroup (as a program that drops privileges, or
one nobody may touch), takes the segment back and sends a RECYCLE HELLO. If WELCOMEd, it claims
a whole ring of bytes toward the server it never writes (holes) and FIN, lets the echo's bytes
through, and prints "ALLOCATED <MiB>": what the server's reads allocated of the client-to-server
block (charged to root's server while connected). Prints "RECYCLE <answer>" first.
Usage: recycle_uid.py PORT"""
import mmap
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402

port = int(sys.argv[1])
RING = 4 << 20
fd = ca.make_segment(RING, 0, 0, ca.CLAIM_DIRECT, ("127.0.0.1", 0), ("127.0.0.1", port))
size = os.fstat(fd).st_size
m = mmap.mmap(fd, size)
block = (size - ca.HEADER) // 2
C2S, S2C = ca.HEADER, ca.HEADER + block
DATA = ca.round_up(768, 1024)


def u64(off):
    return struct.unpack_from("<Q", m, off)[0]


ctl = ca.rendezvous(port)
socket.send_fds(ctl, [ca.message(ca.HELLO, ca.DIRECT)], [fd])
print("FIRST", ca.answer(ctl), flush=True)
# "hi" and FIN toward the server; the echo comes back, then the server's FIN.
m[C2S + DATA:C2S + DATA + 2] = b"hi"
struct.pack_into("<Q", m, C2S, 2)
struct.pack_into("<I", m, C2S + 8, 1)
ca.ring(m, ca.SERVER_WAITING, ctl)
end = time.time() + 10
while time.time() < end and not struct.unpack_from("<I", m, 96)[0] & 2:
    time.sleep(0.02)
parked, ticket = struct.unpack_from("<II", m, 96)
print("PARKED", parked, "ticket", ticket, "echoed", bytes(m[S2C + DATA:S2C + DATA + u64(S2C)]), flush=True)
ctl.close()
# Take it back (section 3, Recycling 2): every counter and flags word of both blocks and both
# waiting words to 0.
struct.pack_into("<I", m, 96, 0)
for base in (C2S, S2C):
    struct.pack_into("<QII", m, base, 0, 0, struct.unpack_from("<I", m, base + 12)[0])
    struct.pack_into("<Q", m, base + 128, 0)
struct.pack_into("<I", m, 128, 0)
struct.pack_into("<I", m, 256, 0)
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
ctl = ca.rendezvous(port)
ctl.send(struct.pack("<IBBBxII", ca.MSG_MAGIC, ca.HELLO, 1, ca.DIRECT, 1, ticket))
a = ca.answer(ctl)
print("RECYCLE", a, "uid", os.getuid(), flush=True)
if a != "WELCOME":
    sys.exit(0)


def mib():
    return ca.allocated(fd, C2S + DATA, C2S + DATA + RING) >> 20


before = mib()
struct.pack_into("<I", m, C2S + 12, RING)
struct.pack_into("<Q", m, C2S, RING)
struct.pack_into("<I", m, C2S + 8, 1)
ca.ring(m, ca.SERVER_WAITING, ctl)
end = time.time() + 20
while time.time() < end and u64(C2S + 128) < RING:
    struct.pack_into("<Q", m, S2C + 128, u64(S2C))  # take the echo (unread: the server stops)
    ca.ring(m, ca.SERVER_WAITING, ctl)
    time.sleep(0.05)
print("READ %d of %d" % (u64(C2S + 128), RING), flush=True)
print("ALLOCATED %d (before %d)" % (mib(), before), flush=True)
