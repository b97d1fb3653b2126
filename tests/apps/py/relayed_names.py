"""The addresses a program sees on a connection it was given as standard I/O (relayed by the
shim: tests/apps/stdio_exec.sh). `filter`: run as an inetd-style server's child with the
connection on 0 and 1, writes fd 0's getsockname and getpeername to fd 1. `client PORT`:
connects, reads that line and checks it names this connection seen from the other end (the
server's own address is what the client dialed, its peer the client's own address). Exits 0
if so. `gone PORT FILE`: connects and closes at once; the filter (run with NAMES_FILE=FILE)
writes its line to FILE too, which is then checked the same way: the program is exec'd after
the client's close (the shim's client resets its carrier then)."""
import os
import time
import socket
import sys

if sys.argv[1] == "filter":
    s = socket.socket(fileno=0)
    line = "%s %d %s %d\n" % (s.getsockname()[:2] + s.getpeername()[:2])
    s.detach()
    if os.environ.get("NAMES_FILE"):
        with open(os.environ["NAMES_FILE"] + ".tmp", "w") as f:
            f.write(line)
        os.rename(os.environ["NAMES_FILE"] + ".tmp", os.environ["NAMES_FILE"])
    try:
        sys.stdout.write(line)
        sys.stdout.flush()
    except OSError:
        pass
elif sys.argv[1] == "gone":
    c = socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=20)
    want = "%s %d %s %d\n" % (c.getpeername()[:2] + c.getsockname()[:2])
    c.close()
    for _ in range(400):
        if os.path.exists(sys.argv[3]):
            break
        time.sleep(0.05)
    got = open(sys.argv[3]).read()
    if got != want:
        sys.exit("the server's program saw %r, the connection was %r" % (got, want))
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
