"""A server for t_rt_orphan_bytes.sh (run by root under colo run): listens on 127.0.0.1:PORT,
prints "READY", and to each connection it accepts writes N bytes and closes it, as an HTTP/1.0
server answers and closes. Usage: write_close_server.py PORT N"""
import socket, sys, threading
port, n = int(sys.argv[1]), int(sys.argv[2])
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port))
ls.listen(128)
print("READY", flush=True)
body = b"o" * n


def serve(c):
    with c:
        c.sendall(body)


while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
