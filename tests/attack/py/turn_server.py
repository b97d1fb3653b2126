"""Root's server for t_rt_turn_nonblock.sh: one accepted connection, held by two writers, one of
which blocks in a large send (its peer never reads); then a non-blocking send on the same
connection, which over TCP returns at once (EAGAIN, or a count).

    turn_server.py PORT fork|thread|relay
        fork:   a fork child makes the blocking send; the parent (an event loop) sends with
                O_NONBLOCK;
        thread: the process forked once (the child exited at once: the connection has been
                shared), one thread's blocking sendall, another thread's send(MSG_DONTWAIT);
        relay:  a subprocess (head) writes its output into the connection as its stdout (the
                shim relays it), the server's event loop sends with O_NONBLOCK.
Prints LISTENING, SENDING, then RETURNED EAGAIN or RETURNED sent N.
"""
import os
import socket
import subprocess
import sys
import threading
import time

port, mode = int(sys.argv[1]), sys.argv[2]
lst = socket.socket()
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", port))
lst.listen(8)
print("LISTENING", flush=True)
conn, _ = lst.accept()
BIG = b"a" * (256 << 20)


def blocking_send():
    try:
        conn.sendall(BIG)
    except OSError:
        pass


child = None
flags = 0
if mode == "fork":
    child = os.fork()
    if child == 0:
        blocking_send()
        os._exit(0)
    conn.setblocking(False)
elif mode == "thread":
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    threading.Thread(target=blocking_send, daemon=True).start()
    flags = socket.MSG_DONTWAIT
else:
    child = subprocess.Popen(["head", "-c", str(256 << 20), "/dev/zero"], stdout=conn.fileno()).pid
    conn.setblocking(False)
time.sleep(2)  # the other writer now waits for room
print("SENDING", flush=True)
try:
    print("RETURNED sent", conn.send(b"y" * 10, flags), flush=True)
except BlockingIOError:
    print("RETURNED EAGAIN", flush=True)
if child:
    os.kill(child, 9)
