"""A server that accepts each connection and hands it to a worker process over a Unix socket
(socket.send_fds), then closes its own copy; the worker reads a line and answers with its length.
For tests/apps/passed.sh. usage: pass_fds.py PORT"""
import os, socket, sys
port = int(sys.argv[1])
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
if os.fork() == 0:
    a.close()
    while True:
        msg, fds, _, _ = socket.recv_fds(b, 16, 1)
        if not fds: os._exit(0)
        c = socket.socket(fileno=fds[0])
        data = b""
        while not data.endswith(b"\n"):
            d = c.recv(65536)
            if not d: break
            data += d
        c.sendall(b"worker got %d\n" % len(data)); c.close()
b.close()
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind(("127.0.0.1", port)); l.listen(16)
print("READY", flush=True)
while True:
    c, _ = l.accept()
    socket.send_fds(a, [b"c"], [c.fileno()]); c.close()
