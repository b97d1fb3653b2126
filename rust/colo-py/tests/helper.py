"""Server processes for the tests. Each prints `READY host:port` once listening.

    helper.py hang        colo server: accept, send b"ready" and one message, then sleep
    helper.py tcp-echo    a plain `socket` TCP echo server (no colo at all)
"""

import socket
import sys
import threading
import time

import colo


def hang() -> None:
    ln = colo.listen("127.0.0.1:0")
    print(f"READY {ln.address}", flush=True)
    c, _ = ln.accept()
    c.sendall(b"ready")
    loan = c.loan(4)
    with memoryview(loan) as v:
        v[:] = b"msg!"
    loan.send()
    time.sleep(3600)


def tcp_echo() -> None:
    ls = socket.create_server(("127.0.0.1", 0))
    print(f"READY 127.0.0.1:{ls.getsockname()[1]}", flush=True)

    def echo(s: socket.socket) -> None:
        with s:
            while True:
                d = s.recv(65536)
                if not d:
                    s.shutdown(socket.SHUT_WR)
                    return
                s.sendall(d)

    while True:
        s, _ = ls.accept()
        threading.Thread(target=echo, args=(s,), daemon=True).start()


if __name__ == "__main__":
    {"hang": hang, "tcp-echo": tcp_echo}[sys.argv[1]]()
