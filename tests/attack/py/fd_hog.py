"""Holds many descriptors open, as another user's processes may: t_rt_relay_proc_scan.sh.

    fd_hog.py NPROC NFD SECONDS
        NFD duplicates of /dev/null in each of NPROC processes for SECONDS; prints HOGGING.
"""
import os
import resource
import sys
import time

nproc, nfd, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (nfd + 100, nfd + 100))
fd = os.open("/dev/null", os.O_RDONLY)
for _ in range(nfd):
    os.dup(fd)
for _ in range(nproc - 1):
    if os.fork() == 0:
        time.sleep(secs)
        os._exit(0)
print("HOGGING", flush=True)
time.sleep(secs)
