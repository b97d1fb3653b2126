"""A connection used, then lent to a child program with subprocess's pass_fds (the shim relays
it: a close-on-exec socket made inheritable), then used again and closed.

    pass_fds_child.py server PORT      echoes each connection; prints "EOF n" at its end
    pass_fds_child.py client PORT N    ping; a child writes N bytes on descriptor 3 and reads
                                       them back; pong; close. Prints OK, or what went wrong.
The relay, a fork of the client, looks at /proc through descriptors the client's connections
had: it must not take them for connections (it hung there, and outlived the client)."""
import socket
import subprocess
import sys
import threading

mode, port = sys.argv[1], int(sys.argv[2])
if mode == "server":
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", port))
    lst.listen(16)
    print("READY", flush=True)

    def echo(c):
        n = 0
        while True:
            d = c.recv(65536)
            if not d:
                break
            n += len(d)
            c.sendall(d)
        c.close()
        print("EOF", n, flush=True)

    while True:
        c, _ = lst.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()

n = int(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"ping")
assert s.recv(10) == b"ping"
child = (
    "import socket\ns = socket.socket(fileno=3)\ns.sendall(b'c' * %d)\ngot = 0\n"
    "while got < %d:\n    d = s.recv(65536)\n    if not d: break\n    got += len(d)\n"
    "s.detach()\nraise SystemExit(0 if got == %d else 1)" % (n, n, n)
)
r = subprocess.run([sys.executable, "-c", child], pass_fds=[s.fileno()], timeout=20)
s.sendall(b"pong")
back = s.recv(10)
s.close()
print("OK" if r.returncode == 0 and back == b"pong" else "child %d, back %r" % (r.returncode, back), flush=True)
