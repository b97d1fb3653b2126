"""Run as root under colo run by t_rt_sndbuf_clamp.sh: an echo server on 127.0.0.1:PORT that asks
for an SO_SNDBUF of ASK bytes, on its listener (inherited by the sockets it accepts) or on each
accepted socket, as `sndbuf=` options of socat, nginx or haproxy do. The kernel clamps the value
to net.core.wmem_max; prints "KERNEL <bytes>", the send buffer the kernel then gives a socket.
Usage: sndbuf_echo.py PORT ASK listener|accepted"""
import socket
import sys
import threading

port, ask, where = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if where == "listener":
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, ask)
ls.bind(("127.0.0.1", port))
ls.listen(16)
probe = socket.socket()
probe.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, ask)
print("KERNEL", probe.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF), flush=True)


def echo(c):
    if where == "accepted":
        c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, ask)
    while True:
        d = c.recv(1 << 20)
        if not d:
            break
        c.sendall(d)


while True:
    c, _ = ls.accept()
    threading.Thread(target=echo, args=(c,), daemon=True).start()
