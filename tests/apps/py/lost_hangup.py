"""A peer that dies while the server is busy (not in epoll_wait) must still be seen as gone: end
of stream, not silence. The server registers its connection with the interest given as argv[3]
(edge or level, with and without EPOLLOUT). The client exits (or is killed) without closing:
after reading the reply (`exit`, `kill`), or right after sending its request (`send_exit`, for
a server started with `late`, which registers only after the client is gone and then reads
once, as nginx does: a short read means drained, and the hang-up must come as EPOLLRDHUP).
Run the server and the client both under `colo run`:

    python3 lost_hangup.py server PORT et_inout &  python3 lost_hangup.py client PORT exit

The server exits 0 when it sees the end (EOF, a reset, or with `late` a hang-up event) within
3 s, 1 otherwise."""
import os, select, signal, socket, sys, time

role, port = sys.argv[1], int(sys.argv[2])
if role == "client":
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"req")
    if sys.argv[3] == "send_exit":
        os._exit(0)
    s.recv(100)
    if sys.argv[3] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)  # no close: the process's end goes with it

E = select
INTEREST = {
    "et_inout": E.EPOLLIN | E.EPOLLOUT | E.EPOLLRDHUP | E.EPOLLET,
    "et_in": E.EPOLLIN | E.EPOLLRDHUP | E.EPOLLET,
    "lt_inout": E.EPOLLIN | E.EPOLLOUT | E.EPOLLRDHUP,
    "lt_in": E.EPOLLIN,
    "et_inout_nordhup": E.EPOLLIN | E.EPOLLOUT | E.EPOLLET,
}[sys.argv[3]]
ls = socket.socket()
ls.bind(("127.0.0.1", port))
ls.listen(4)
print("ready", flush=True)
signal.alarm(10)  # watchdog
c, _ = ls.accept()
c.setblocking(False)
late = sys.argv[4:] == ["late"]
if late:
    time.sleep(0.3)  # the client sends and dies meanwhile
ep = select.epoll()
ep.register(c.fileno(), INTEREST)
start, replied, seen = time.time(), False, []
while time.time() - start < 3:
    for _, ev in ep.poll(1.0):
        seen.append(hex(ev))
        if late:
            if ev & (E.EPOLLRDHUP | E.EPOLLHUP | E.EPOLLERR):
                sys.exit(0)
            if ev & E.EPOLLIN and not c.recv(4096):  # one read: a short one means drained
                sys.exit(0)
            continue
        if not ev & (E.EPOLLIN | E.EPOLLRDHUP | E.EPOLLHUP | E.EPOLLERR):
            continue
        while True:
            try:
                d = c.recv(100)
            except BlockingIOError:
                break
            except OSError:
                sys.exit(0)  # a reset is an answer too
            if not d:
                sys.exit(0)
            if not replied:
                c.send(b"reply")
                replied = True
                time.sleep(0.3)  # busy: the client reads the reply and dies meanwhile
                break
print("lost hang-up: no end of stream within 3 s; events:", seen[:8], file=sys.stderr)
sys.exit(1)
