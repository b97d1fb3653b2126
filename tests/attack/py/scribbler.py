"""Run as nobody by t_rt_scribble.sh: N CARRIER connections to a colo server under the shim at
127.0.0.1:PORT (doorbell_attacker.Conn), each with a pool (so that the message words are live
too), then SECONDS of random and adversarial values written into every word the server reads
(both direction blocks, the waiting words, the claim word), each round followed by a doorbell
ring and a futex wake, with a request written first so the server has something to answer.
Prints "RESULT welcomed=N rounds=R".
Usage: scribbler.py PORT N SECONDS"""
import ctypes
import os
import random
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doorbell_attacker as da  # noqa: E402

port, n, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
conns = []
for _ in range(n):
    c = da.Conn(port, da.CARRIER, "control")
    a = da.answer(c.ctl)
    if a and a[0] == "welcome":
        conns.append(c)
    else:
        c.ctl.close()
print("welcomed", len(conns), flush=True)
U64 = [0, 1, 2**63, 2**64 - 1, 2**64 - 4096, 65536, 65537, 2**32, 2**32 - 1]
U32 = [0, 1, 2, 3, 4, 7, 8, 0xFFFFFFFF, 0x80000000, 0x102, 0x103]
words64 = []
words32 = []
for blk in (da.C2S, da.S2C):
    words64 += [blk + 0, blk + 128, blk + 256, blk + 384, blk + 512, blk + 640]
    words32 += [blk + 8, blk + 136]
words32 += [36, da.CLIENT_WAITING, da.SERVER_WAITING, 96]
words64 += [384, 512]
rounds = 0
end = time.time() + secs
rng = random.Random(int.from_bytes(os.urandom(8), "little"))
while time.time() < end and conns:
    for c in conns:
        m = c.m
        try:
            # A well-formed request first, then garbage over everything.
            head = struct.unpack_from("<Q", m, da.C2S)[0]
            req = b"PING\r\n"
            for i, ch in enumerate(req):
                m[da.C2S + da.DATA_OFF + (head + i) % da.RING] = ch
            struct.pack_into("<Q", m, da.C2S, (head + len(req)) % 2**64)
            for _ in range(rng.randrange(1, 6)):
                if rng.random() < 0.6:
                    w = rng.choice(words64)
                    v = rng.choice(U64) if rng.random() < 0.5 else rng.getrandbits(64)
                    struct.pack_into("<Q", m, w, v)
                else:
                    w = rng.choice(words32)
                    v = rng.choice(U32) if rng.random() < 0.5 else rng.getrandbits(32)
                    struct.pack_into("<I", m, w, v)
            c.ring_server()
        except (OSError, ValueError, struct.error):
            pass
    rounds += 1
    time.sleep(0.001)
print("RESULT welcomed=%d rounds=%d" % (len(conns), rounds), flush=True)
