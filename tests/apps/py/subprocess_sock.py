"""A Python server hands an accepted connection (close-on-exec, as Python makes every socket)
to `cat` as its standard input and output with subprocess (vfork and dup2 in the child), under
`colo run`, as is the client (a fork of this process): every byte comes back in order; then the
server's own standard output is still its own (prints "parent-after" there). Exit 0 if so.
signal.alarm is the watchdog."""
import os, signal, socket, subprocess, sys

signal.alarm(30)
N = 3_000_000
data = os.urandom(N)
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(4)
port = l.getsockname()[1]
pid = os.fork()
if pid == 0:
    l.close()
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(data)
    c.shutdown(socket.SHUT_WR)
    got = bytearray()
    while True:
        b = c.recv(65536)
        if not b:
            break
        got += b
    os._exit(0 if got == data else 1)
c, _ = l.accept()
p = subprocess.Popen(["cat"], stdin=c, stdout=c)
c.close()
rc = p.wait()
_, st = os.waitpid(pid, 0)
os.write(1, b"parent-after\n")
sys.exit(rc or (0 if os.waitstatus_to_exitcode(st) == 0 else 1))
