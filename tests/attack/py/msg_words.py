"""Run as nobody by t_rt_msg_words.sh: CARRIER connections to root's message echo server at
127.0.0.1:PORT (colo-peer server ADDR msg: Recv, Loan, Send, Release, in a loop) whose segments
have a pool of one slot a direction, and one counter of the message queues (spec/WIRE.md
section 7) that only the server writes set to a value it does not hold, then silence:
  recv  the server waits in Recv for a message; C2S `msg_tail` (the server's count of messages
        received) is set one past `msg_head`;
  loan  one message sent and its echo never released, then a second: the server's Loan waits
        for a free slot; S2C `free_tail` (the server's count of releases taken back) is set one
        past `free_head`.
Each connection is rung once after its scribble (as a peer's progress would), then held for
SECONDS (less if the test says LEAVE: colo_attack.hold). A server that waits on its own counter as the peer left it never sleeps again.
Prints "SET <mode> <n>" once every connection is set, then "RESULT held=<n>" at the end.
Usage: msg_words.py PORT recv|loan N SECONDS"""
import ctypes
import mmap
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402

port, mode, n, hold = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
RING, SLOT, SLOTS = 4096, 64, 1
SIZE = ca.segment_size(RING, SLOT, SLOTS)
BLOCK = (SIZE - ca.HEADER) // 2
C2S, S2C = ca.HEADER, ca.HEADER + BLOCK
MSG_HEAD, MSG_TAIL, FREE_HEAD, FREE_TAIL, MSG_ENT = 256, 384, 512, 640, 768
FREE_ENT = MSG_ENT + 8 * SLOTS
POOL = ca.round_up(ca.round_up(768 + 12 * SLOTS, 1024) + RING, 4096)
LIBC = ctypes.CDLL(None, use_errno=True)


def rd(m, off):
    return struct.unpack_from("<Q", m, off)[0]


def ring(ctl, m):
    """Wakes the server as its waiting word asks, and rings its doorbell whatever it says."""
    ca.ring(m, ca.SERVER_WAITING, ctl)


def send(ctl, m, k):
    """Sends message number k (0, 1, ...) in slot 0 of C2S, which the server released before."""
    m[C2S + POOL:C2S + POOL + 8] = b"msg%05d" % k
    struct.pack_into("<II", m, C2S + MSG_ENT, 0, 8)
    struct.pack_into("<Q", m, C2S + MSG_HEAD, k + 1)
    ring(ctl, m)


def wait_for(m, off, value, seconds=5.0):
    end = time.time() + seconds
    while time.time() < end:
        if rd(m, off) >= value:
            return True
        time.sleep(0.005)
    return False


def make_segment(*a, **k):
    # make_segment with a pool of our geometry (carrier_offer asks for no pool).
    return ca_make_segment(RING, SLOT, SLOTS, *a[3:], **k)


ca_make_segment, ca.make_segment = ca.make_segment, make_segment
ca.raise_nofile()
conns = []
for _ in range(n):
    t, ctl, fd = ca.carrier_offer(RING, port)
    a = ca.answer(ctl)
    if a != "WELCOME":
        print("answer", a, flush=True)
        continue
    m = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    if mode == "recv":
        time.sleep(0.05)  # the server reaches its Recv
        struct.pack_into("<Q", m, C2S + MSG_TAIL, 1)
        ring(ctl, m)
    else:
        send(ctl, m, 0)
        # The server received it (released our slot) and sent its echo (its only slot).
        if not (wait_for(m, C2S + FREE_HEAD, 1) and wait_for(m, S2C + MSG_HEAD, 1)):
            print("no echo", flush=True)
            continue
        struct.pack_into("<Q", m, C2S + FREE_TAIL, 1)  # we took our slot back
        send(ctl, m, 1)
        if not wait_for(m, C2S + MSG_TAIL, 2):  # received: its Loan now waits
            print("second message not received", flush=True)
            continue
        time.sleep(0.05)
        struct.pack_into("<Q", m, S2C + FREE_TAIL, rd(m, S2C + FREE_HEAD) + 1)
        ring(ctl, m)
    conns.append((t, ctl, fd, m))
print("SET %s %d" % (mode, len(conns)), flush=True)
ca.hold(hold)
print("RESULT held=%d" % len(conns), flush=True)
