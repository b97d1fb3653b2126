"""A server that hands each accepted connection to a program it executes (python's subprocess
with pass_fds, which makes the socket inheritable in the child only): the program echoes every
byte until the client's end of stream. Serves one connection at a time, until killed.
Usage: exec_pass_fds.py PORT"""
import socket
import subprocess
import sys

ECHO = """import socket
s = socket.socket(fileno=%d)
while True:
    b = s.recv(65536)
    if not b:
        break
    s.sendall(b)
s.close()
"""
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(8)
while True:
    c, _ = l.accept()
    p = subprocess.Popen([sys.executable, "-c", ECHO % c.fileno()], pass_fds=[c.fileno()])
    c.close()
    p.wait()
