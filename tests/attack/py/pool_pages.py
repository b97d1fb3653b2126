"""Run as nobody by t_rt_pool_pages.sh: N CARRIER connections to root's message echo server at
127.0.0.1:PORT whose segments have a pool of SLOTS slots of 64 KiB a direction (and 4 KiB rings).
On each, nobody sends SLOTS messages of 64 KiB (slot i, left unwritten: holes) and never releases
a slot the server sends back: the server's echo loans every slot of its own (S2C) pool and writes
64 KiB into each, pages charged to the server, in nobody's memfd. Then, as MODE says:
- `hangup`: nobody hangs up (closes its control socket and TCP connection);
- `fin`: nobody sets FIN on its ring and rings, and stays connected, holding every message;
- `toggle`: as `fin`, while $TOGGLER (c/toggle_word.c) flips the `free_head` of the server's
  pool in every memfd between "every message released" and "one held", as fast as it can, from
  before the FIN until TOGGLE seconds after it; then nobody holds one message (`free_head` one
  short) and hangs up; ROUNDS times over (N new connections each), each round a chance more
  for a close to read the word twice across a flip.
Either way the server closes its end, and nobody keeps the memfds (mapped) and prints, every
second for SECONDS (less if the test says LEAVE: colo_attack.hold), "S2C_POOL <KiB>": the pages
of the server's pools still allocated in them.
Usage: pool_pages.py PORT N SLOTS MODE SECONDS"""
import os
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402

port, n, slots, mode, seconds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
RING, SLOT = 4096, 64 << 10

size = ca.segment_size(RING, SLOT, slots)
block = (size - ca.HEADER) // 2
c2s, s2c = ca.HEADER, ca.HEADER + block
pool = ca.round_up(ca.round_up(768 + 12 * slots, 1024) + RING, 4096)
kept = []
for _ in range(int(os.environ.get("ROUNDS", "1"))):
    conns = ca.welcomed_carriers(RING, port, n, SLOT, slots)
    kept += conns
    for t, ctl, fd, m in conns:
        for i in range(slots):
            struct.pack_into("<II", m, c2s + 768 + 8 * i, i, SLOT)
        struct.pack_into("<Q", m, c2s + 256, slots)  # msg_head: every slot sent
        ca.ring(m, ca.SERVER_WAITING, ctl)
    # The server echoes every message into a slot of its own pool.
    end = time.time() + 20
    while time.time() < end and any(struct.unpack_from("<Q", c[3], s2c + 256)[0] < slots for c in conns):
        time.sleep(0.05)
    echoed = sum(struct.unpack_from("<Q", c[3], s2c + 256)[0] for c in conns)
    print("ECHOED %d of %d" % (echoed, n * slots), flush=True)
    tog = None
    if mode == "toggle":
        fds = [fd for _, _, fd, _ in conns]
        tog = subprocess.Popen([os.environ["TOGGLER"], str(s2c + 512), str(slots)] + [str(fd) for fd in fds],
                               pass_fds=fds, stdout=subprocess.PIPE, text=True)
        print(tog.stdout.readline().strip(), flush=True)
    for t, ctl, fd, m in conns:
        if mode == "hangup":
            ctl.close()
            t.close()
        else:
            struct.pack_into("<I", m, c2s + 8, struct.unpack_from("<I", m, c2s + 8)[0] | 1)  # FIN
            ca.ring(m, ca.SERVER_WAITING, ctl)
    print("LEFT", mode, flush=True)
    if tog is not None:
        time.sleep(float(os.environ.get("TOGGLE", "12")))
        tog.kill()
        tog.wait()
        for t, ctl, fd, m in conns:
            struct.pack_into("<Q", m, s2c + 512, slots - 1)  # free_head: one message held
            ctl.close()
            t.close()
        print("HUNG UP", flush=True)
leave, end = os.environ.get("LEAVE"), time.time() + seconds
while time.time() < end and not (leave and os.path.exists(leave)):
    time.sleep(1)
    kib = sum(ca.allocated(fd, s2c + pool, size) for _, _, fd, _ in kept) >> 10
    print("S2C_POOL %d" % kib, flush=True)
