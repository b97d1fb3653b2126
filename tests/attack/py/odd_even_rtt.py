"""Plain TCP clients (no colo) of an echo server at 127.0.0.1:PORT, alternately from an odd and
an even source port: the time from connect to the echo of one byte. Prints
"RESULT odd_ms=M even_ms=M" (medians over N of each). REQUEST (default "x", backslash escapes
allowed) is sent instead of the byte, and the first byte of the answer awaited.
Usage: odd_even_rtt.py PORT N [REQUEST]"""
import random
import socket
import sys
import time

port, n = int(sys.argv[1]), int(sys.argv[2])
request = sys.argv[3].encode().decode("unicode_escape").encode("latin-1") if len(sys.argv) > 3 else b"x"


def one(parity):
    while True:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", random.randrange(40000, 60000) // 2 * 2 + parity))
            break
        except OSError:
            s.close()
    t = time.monotonic()
    s.connect(("127.0.0.1", port))
    s.sendall(request)
    s.recv(1)
    t = time.monotonic() - t
    s.close()
    return t


times = {1: [], 0: []}
for _ in range(n):
    for parity in (1, 0):
        times[parity].append(one(parity))
med = {p: sorted(v)[n // 2] * 1e3 for p, v in times.items()}
print("RESULT odd_ms=%.3f even_ms=%.3f" % (med[1], med[0]))
