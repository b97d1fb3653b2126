"""A server for t_rt_orphan_bytes.sh (run by root under colo run): listens on 127.0.0.1:PORT,
prints "READY", and hands each connection it accepts to a new python image as its standard
input and output (the shim relays a connection an exec'd image gets so), which writes N bytes
"o" and exits, as an inetd-style service answers and ends. Usage: exec_write_server.py PORT N"""
import os, signal, socket, sys
port, n = int(sys.argv[1]), sys.argv[2]
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port))
ls.listen(128)
print("READY", flush=True)
while True:
    c, _ = ls.accept()
    if os.fork() == 0:
        ls.close()
        os.dup2(c.fileno(), 0)
        os.dup2(c.fileno(), 1)
        c.close()
        os.execv(sys.executable, [sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'o' * %s)" % n])
    c.close()
