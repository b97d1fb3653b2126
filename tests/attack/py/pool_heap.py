"""Run as nobody by t_rt_pool_heap.sh: N CARRIER connections to root's server at 127.0.0.1:PORT
whose segments have a message pool of SLOTS slots of 64 bytes (spec/WIRE.md section 4: up to
65536; 0 for none) and 4 KiB rings: about 10 MB of sparse memfd a connection, which costs nobody
nothing (the memfd is closed once sent). With `send`, each connection then sends one message
(slot 0, 8 bytes) and rings, so that a server that receives messages takes it. Prints
"SET <answers> <segment size>" once every connection is answered, holds them SECONDS (less if
the test says LEAVE: colo_attack.hold), then "RESULT held=<n>".
Usage: pool_heap.py PORT N SLOTS SECONDS [send]"""
import mmap
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402

port, n, slots, hold = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
send = sys.argv[5:] == ["send"]
RING, SLOT = 4096, 64 if slots else 0


def make_segment(*a, **k):
    # carrier_offer asks for no pool: this geometry instead.
    return honest(RING, SLOT, slots, *a[3:], **k)


honest, ca.make_segment = ca.make_segment, make_segment
ca.raise_nofile()
held, answers = [], {}
for _ in range(n):
    t, ctl, fd = ca.carrier_offer(RING, port)
    a = ca.answer(ctl)
    if send and slots and a == "WELCOME":
        size = ca.segment_size(RING, SLOT, slots)
        m = mmap.mmap(fd, size)
        c2s, pool = ca.HEADER, ca.round_up(ca.round_up(768 + 12 * slots, 1024) + RING, 4096)
        m[c2s + pool:c2s + pool + 8] = b"message!"
        struct.pack_into("<II", m, c2s + 768, 0, 8)  # entry {slot 0, 8 bytes}
        struct.pack_into("<Q", m, c2s + 256, 1)  # msg_head
        m.close()
        ctl.send(b"r", socket.MSG_DONTWAIT)
    os.close(fd)
    answers[a] = answers.get(a, 0) + 1
    held.append((t, ctl))
print("SET", answers, ca.segment_size(RING, SLOT, slots), flush=True)
ca.hold(hold)
print("RESULT held=%d" % len(held), flush=True)
