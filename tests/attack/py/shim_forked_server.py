"""A server whose worker is a fork child of the process that listens (the shape of a
multi-worker server), accepting each connection DELAY seconds late, so an offer stays pending
in the listening process's offer service meanwhile. Each connection's first line is appended to
OUT and answered "OK". Prints "READY master worker" once listening.

usage: shim_forked_server.py PORT OUT DELAY
"""
import os
import socket
import sys
import time

port, out, delay = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", port))
l.listen(64)
worker = os.fork()
if worker == 0:
    while True:
        time.sleep(delay)
        c, _ = l.accept()
        data = b""
        while not data.endswith(b"\n"):
            b = c.recv(4096)
            if not b:
                break
            data += b
        with open(out, "ab") as f:
            f.write(data)
        c.sendall(b"OK\n")
        c.close()
print("READY", os.getpid(), worker, flush=True)
os.wait()
