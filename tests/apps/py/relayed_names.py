"""The addresses a program sees on a connection it was given as standard I/O (relayed by the
shim: tests/apps/stdio_exec.sh). `filter`: run as an inetd-style server's child with the
connection on 0 and 1, writes fd 0's getsockname and getpeername to fd 1. `client PORT`:
connects, reads that line and checks it names this connection seen from the other end (the
server's own address is what the client dialed, its peer the client's own address). Exits 0
if so."""
import socket
import sys

if sys.argv[1] == "filter":
    s = socket.socket(fileno=0)
    line = "%s %d %s %d\n" % (s.getsockname()[:2] + s.getpeername()[:2])
    s.detach()
    sys.stdout.write(line)
    sys.stdout.flush()
else:
    c = socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=20)
    got = b""
    while not got.endswith(b"\n"):
        b = c.recv(4096)
        if not b:
            break
        got += b
    want = "%s %d %s %d\n" % (c.getpeername()[:2] + c.getsockname()[:2])
    if got.decode() != want:
        sys.exit("the server's program saw %r, the connection is %r" % (got.decode(), want))
