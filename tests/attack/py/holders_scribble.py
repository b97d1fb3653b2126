"""nobody's attacker for t_rt_holders_dumpable.sh: writes, through /proc/PID/mem of a dumpable
process of its own uid, into the holders file (memfd colo-holders) that process maps: in every
slot in use, the connection is marked shared and its writers' and readers' turns are given to
this process (alive, so never taken over).

    holders_scribble.py PID SECONDS
Writes for SECONDS, prints WROTE n (slots written), then lives on (holding the turns) until
killed. Prints MAPPED addr first, or NOMAP / DENIED what errno.
"""
import os
import struct
import sys
import time

pid, seconds = int(sys.argv[1]), float(sys.argv[2])
SLOT, HOLDERS, FIRST, CAPACITY = 512, 64, 8, (8 << 20) // 512
TURN, SHARED, READ_TURN = HOLDERS, HOLDERS + 3, HOLDERS + 6
base = None
try:
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            if "colo-holders" in line:
                base = int(line.split("-")[0], 16)
                break
except OSError as e:
    print("DENIED maps", e.errno, flush=True)
    sys.exit(0)
if base is None:
    print("NOMAP", flush=True)
    sys.exit(0)
print("MAPPED %x" % base, flush=True)
try:
    mem = os.open("/proc/%d/mem" % pid, os.O_RDWR)
except OSError as e:
    print("DENIED mem", e.errno, flush=True)
    sys.exit(0)
me = struct.pack("<I", os.getpid())
written = 0
until = time.monotonic() + seconds
while True:
    try:
        bitmap = os.pread(mem, CAPACITY // 8, base)
    except OSError as e:
        print("DENIED read", e.errno, flush=True)
        sys.exit(0)
    for slot in range(FIRST, CAPACITY):
        if bitmap[slot // 8] & (1 << (slot % 8)):
            at = base + slot * SLOT
            os.pwrite(mem, struct.pack("<I", 1), at + 4 * SHARED)
            os.pwrite(mem, me, at + 4 * TURN)
            os.pwrite(mem, me, at + 4 * READ_TURN)
            written += 1
    if time.monotonic() >= until:
        break
    time.sleep(0.1)
print("WROTE", written, flush=True)
time.sleep(600)
