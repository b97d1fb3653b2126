"""Run as nobody, a reader of a server's COLO_NETNS_DIR, by t_rt_netns_live_readlock.sh: takes an
open file description read lock (F_OFD_SETLK, F_RDLCK, the whole file) on FILE (a dead server's
`.live`), opened read-only, which a reader may take, and holds it SECONDS.
Prints "LOCKED" or "FAILED <errno>".
Usage: live_rdlock.py FILE SECONDS"""
import fcntl
import os
import struct
import sys
import time

F_OFD_SETLK = 37
fd = os.open(sys.argv[1], os.O_RDONLY)
try:
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks).
    fcntl.fcntl(fd, F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0))
    print("LOCKED", flush=True)
except OSError as e:
    print("FAILED", e.errno, flush=True)
time.sleep(float(sys.argv[2]))
