"""Used by t_rt_netns_norv_stall.sh: a plain TCP client of an echo server that connects to
HOST:PORT, sends "ping\n" and reads the 5 bytes back. Prints "ECHO <ms> <bytes>" (ms from the
connect to the last byte back), or "ECHO <ms> <what came> short" if the stream ended early.
Usage: timed_echo.py HOST PORT"""
import socket
import sys
import time

t = time.monotonic()
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
s.sendall(b"ping\n")
got = b""
while len(got) < 5:
    c = s.recv(5 - len(got))
    if not c:
        break
    got += c
print("ECHO %d %r%s" % ((time.monotonic() - t) * 1000, got, "" if got == b"ping\n" else " short"), flush=True)
