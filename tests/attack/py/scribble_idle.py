"""Run as nobody by t_rt_scribble_idle.sh: opens CARRIER connections to the colo server at
127.0.0.1:PORT (doorbell_attacker.Conn: 64 KiB rings, doorbells one socket pair), brings each
server end into one of two states, leaves one adversarial value set in shared words of each
segment (every word of both direction blocks the server reads or writes, ring_size and the
space_wake mark included, the waiting words, the claim and parked words, the *_written copies),
rings the server once, and then does nothing for HOLD seconds (less if the test says LEAVE:
colo_attack.hold), every connection held open. The server must not spin on any of them
meanwhile (the test measures its CPU time), nor hang.
States: "read" (the server waits for a request), "write" (the attacker wrote more than both
rings hold and reads nothing back: the server's echo waits for space).
Prints "SCRIBBLED <n> <states>" once every connection is set, then "RESULT ..." at the end.
Usage: scribble_idle.py PORT HOLD"""
import ctypes
import os
import re
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402
import doorbell_attacker as da  # noqa: E402

port, hold = int(sys.argv[1]), float(sys.argv[2])
C2S, S2C, M64 = da.C2S, da.S2C, 2**64 - 1
# (label, [(offset, bytes, value or callable(current) -> value)])
SCRIBBLES = [("none", [])]  # the control: an honest idle connection
for name, blk in (("c2s", C2S), ("s2c", S2C)):
    for v in (M64, 2**63, 1 << 40, lambda c: c + 1, lambda c: c + 65537, lambda c: c - 1):
        SCRIBBLES.append((name + ".head", [(blk, 8, v)]))
    for v in (1, 2, 4, 8, 0xFFFFFFFF):
        SCRIBBLES.append((name + ".flags", [(blk + 8, 4, v)]))
    for v in (0, 1, 3, 1024, 4096, 65536, 131072, 0x80000000, 0xFFFFFFFF):
        SCRIBBLES.append((name + ".ring_size", [(blk + 12, 4, v)]))
    for v in (1, 2047, 65535, 65536, 0xFFFFFFFF):
        SCRIBBLES.append((name + ".space_wake", [(blk + 16, 4, v)]))
    for v in (M64, lambda c: c + 1, lambda c: c - 1, lambda c: c + 65537):
        SCRIBBLES.append((name + ".tail", [(blk + 128, 8, v)]))
    for v in (1, 0xFFFFFFFF):
        SCRIBBLES.append((name + ".read_flags", [(blk + 136, 4, v)]))
    SCRIBBLES.append((name + ".msg_words", [(blk + o, 8, M64) for o in (256, 384, 512, 640)]))
for v in (0, 2, 3, 0xFFFFFFFF):
    SCRIBBLES.append(("claim", [(36, 4, v)]))
for v in (3, 0xFFFFFFFF):
    SCRIBBLES.append(("parked", [(96, 4, v)]))
for v in (3, 0xFFFFFFFF):
    SCRIBBLES.append(("client_waiting", [(da.CLIENT_WAITING, 4, v)]))
for v in (0, 1, 2, 3, 0x100, 0xFFFFFFFF):
    SCRIBBLES.append(("server_waiting", [(da.SERVER_WAITING, 4, v)]))
for v in (0, M64, 12345):
    SCRIBBLES.append(("c2s_written", [(384, 8, v)]))
    SCRIBBLES.append(("s2c_written", [(512, 8, v)]))
# Another holder of the server's end "wrote" (s2c_written differs from its head): an end that
# takes over from ring_head reads the ring's words back.
for words in ([(S2C + 12, 4, 0)], [(S2C + 12, 4, 3)], [(S2C + 12, 4, 0xFFFFFFFF)], [(S2C, 8, M64)],
              [(S2C + 16, 4, 0xFFFFFFFF)], [(S2C, 8, lambda c: c + 70000), (S2C + 16, 4, 0xFFFFFFFF)]):
    SCRIBBLES.append(("s2c_written+" + ",".join(str(w[0] - S2C) for w in words), [(512, 8, 777)] + words))
# The attacker's direction claims a full ring of bytes the server has not seen, at each mark.
for v in (0, 1, 65535, 0xFFFFFFFF):
    SCRIBBLES.append(("c2s.full+space_wake", [(C2S + 12, 4, 65536), (C2S, 8, lambda c: c + 65536), (C2S + 16, 4, v)]))


def rd(m, off, n):
    return struct.unpack_from("<Q" if n == 8 else "<I", m, off)[0]


def wr(m, off, n, v):
    struct.pack_into("<Q" if n == 8 else "<I", m, off, v % (2**64 if n == 8 else 2**32))


def push(c, nbytes):
    """Writes what fits of nbytes into C2S (its ring stays 2048 bytes) and rings the server;
    returns how many it wrote."""
    m, size = c.m, 2048
    head, tail = rd(m, C2S, 8), rd(m, C2S + 128, 8)
    n = min(size - (head - tail), nbytes)
    if n <= 0:
        return 0
    at = head % size
    first = min(n, size - at)
    base = C2S + da.DATA_OFF
    m[base + at:base + at + first] = b"a" * first
    m[base:base + n - first] = b"a" * (n - first)
    wr(m, C2S, 8, head + n)
    c.ring_server()
    return n


# Each label numbered within its kind (c2s.head#0, ...), so that one can be picked.
_seen = {}
for i, (label, w) in enumerate(SCRIBBLES):
    _seen[label] = _seen.get(label, -1) + 1
    SCRIBBLES[i] = ("%s#%d" % (label, _seen[label]), w)
# SCRIBBLE_ONLY=REGEX (label) and SCRIBBLE_STATES=read,write narrow the set (to find which one).
only = re.compile(os.environ.get("SCRIBBLE_ONLY", ""))
SCRIBBLES = [(label, w) for label, w in SCRIBBLES if only.search(label)]
conns, states = [], {"read": 0, "write": 0}
for state in os.environ.get("SCRIBBLE_STATES", "read,write").split(","):
    for label, words in SCRIBBLES:
        try:
            c = da.Conn(port, da.CARRIER, "control")
        except OSError as e:
            print("connect failed:", e, flush=True)
            continue
        a = da.answer(c.ctl)
        if not a or a[0] != "welcome":
            print("not welcomed:", label, a, flush=True)
            c.ctl.close()
            continue
        conns.append([label, state, c, 0, words])
# Requests: a short one (answered; the server then waits for the next), or more than the server's
# S2C ring holds, never read back (the server's echo blocks writing), pushed to all connections
# round-robin until none takes more.
idle_rounds, end = 0, time.time() + 20
while idle_rounds < 50 and time.time() < end:
    moved = 0
    for e in conns:
        want = (10 if e[1] == "read" else 3 * 65536) - e[3]
        if want > 0:
            n = push(e[2], want)
            e[3] += n
            moved += n
    idle_rounds = 0 if moved else idle_rounds + 1
    time.sleep(0.002)
time.sleep(0.2)
for label, state, c, _, words in conns:
    for off, n, v in words:
        wr(c.m, off, n, v(rd(c.m, off, n)) if callable(v) else v)
    # Rung without touching the waiting words (ring_server clears the server's).
    try:
        c.ours.send(b"r", socket.MSG_DONTWAIT)
    except OSError:
        pass
    addr = ctypes.addressof(ctypes.c_char.from_buffer(c.m, da.SERVER_WAITING))
    da.LIBC.syscall(202, ctypes.c_void_p(addr), 1, 0x7FFFFFFF, None, None, 0)  # FUTEX_WAKE
    states[state] += 1
print("SCRIBBLED", len(conns), states, sum(e[3] for e in conns), flush=True)
ca.hold(hold)
print("RESULT held=%d" % len(conns), flush=True)
