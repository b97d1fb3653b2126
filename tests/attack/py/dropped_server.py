"""Run by root under colo run for t_rt_dropped_server.sh: a server that listens as
root, then drops to nobody:nogroup and serves (nginx with `user nobody;`: its master listens,
its workers setuid and accept), dumpable again as nginx makes its workers
(prctl(PR_SET_DUMPABLE, 1), for core dumps). It accepts one connection, reads its first byte,
prints "ACCEPTED <pid>" and holds it for HOLD seconds without writing.
Usage: dropped_server.py PORT HOLD"""
import ctypes
import os
import socket
import sys
import time

port, hold = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(8)
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
print("LISTENING", flush=True)
c, _ = s.accept()
c.recv(1)
print("ACCEPTED %d" % os.getpid(), flush=True)
time.sleep(hold)
c.close()
