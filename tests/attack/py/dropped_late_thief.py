"""Run as nobody by t_rt_uid_change_after_answer.sh: root's server PID answered its
client as root and is nobody's now, dumpable (py/dropped_late_server.py). Its memfd is closed
(a same-user peer's is), so this writes the connection's words through /proc/PID/mem (which
the kernel allows the process's own user once it is dumpable): claims a whole ring of bytes
toward the client it never writes (holes) and FIN, then kills the server, whose hang-up wakes
the client to read them. Prints "CLAIMED <bytes>" (or "NO SEGMENT").
Usage: dropped_late_thief.py PID"""
import os
import signal
import struct
import sys

HEADER = 1024
pid = int(sys.argv[1])
seg = None
with open("/proc/%d/maps" % pid) as f:
    for line in f:
        if "memfd:colo-seg" in line or "memfd:colo " in line:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            seg = (lo, hi - lo)
            break
if seg is None:
    print("NO SEGMENT", flush=True)
    sys.exit(0)
base, _ = seg
mem = os.open("/proc/%d/mem" % pid, os.O_RDWR)
size = struct.unpack("<Q", os.pread(mem, 8, base + 16))[0]  # the header's segment size
capacity, _slot_size, _slots = struct.unpack("<III", os.pread(mem, 12, base + 24))
s2c = base + HEADER + (size - HEADER) // 2
head = struct.unpack("<Q", os.pread(mem, 8, s2c))[0]
os.pwrite(mem, struct.pack("<I", capacity), s2c + 12)
os.pwrite(mem, struct.pack("<Q", head + capacity), s2c)
os.pwrite(mem, struct.pack("<I", 1), s2c + 8)  # FIN
print("CLAIMED %d" % capacity, flush=True)
os.kill(pid, signal.SIGKILL)
