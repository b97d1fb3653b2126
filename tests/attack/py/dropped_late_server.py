"""Run by root under colo run for t_rt_uid_change_after_answer.sh: a server that
listens and accepts as root (its answer to the client's HELLO comes from root), reads the
connection's first byte, then drops to nobody:nogroup and goes on serving it, dumpable again
(prctl(PR_SET_DUMPABLE, 1), as nginx makes its workers, for core dumps): a privilege-separated
server that drops per connection after accepting it. Prints "ACCEPTED <pid>" and holds the
connection for HOLD seconds without writing.
Usage: dropped_late_server.py PORT HOLD"""
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
print("LISTENING", flush=True)
c, _ = s.accept()
c.recv(1)
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
print("ACCEPTED %d" % os.getpid(), flush=True)
time.sleep(hold)
c.close()
