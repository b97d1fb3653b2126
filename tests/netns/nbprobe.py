"""Clients and a server for the connect path across namespaces, for tests/netns/run.sh (stanza 14).

    nbprobe.py serve PORT DELAY echo|banner|magic
        A server on PORT that accepts each connection DELAY seconds after it arrived (its
        program busy), then
        per connection: `echo` reads a 4-byte length and that many bytes and sends them back;
        `banner` first sends `PAYLOAD` bytes (the server speaks first), then echoes as `echo`;
        `magic` first sends `MAGIC_BANNER` (bytes that, 4 bytes in, look like the head of an
        answer to a PROPOSAL), then echoes.
        Prints `READY` once listening. Watchdog: 300 s.
    nbprobe.py nbclient HOST PORT echo|banner
        A non-blocking connect to HOST:PORT: prints the errno it returned (`EINPROGRESS`, or
        `0`), then polls for POLLOUT (10 s), prints `SO_ERROR`'s name (`0` for none), then
        exchanges the bytes of the mode on the non-blocking socket, polling, and prints
        `INTACT` or what differed. Everything on one line.
    nbprobe.py pollzero HOST PORT echo|banner
        A non-blocking connect, then `poll` for POLLOUT without waiting, again and again (1 ms
        apart) until reported: prints the connect's errno, `NOTYET` if some poll reported
        nothing first (`DECIDED` if the first one reported POLLOUT), `SO_ERROR`'s name, then
        `INTACT` or what differed.
    nbprobe.py aioclient HOST PORT echo|banner
        The same through asyncio's streams (a non-blocking connect, then epoll): prints
        `CONNECTED`, then `INTACT` or what differed.
    nbprobe.py dupclient HOST PORT
        Against a `magic` server: a blocking connect, then 4 bytes read through a dup of the
        socket and the rest of `MAGIC_BANNER` through the socket itself: prints `CONNECTED`,
        then `INTACT` or what differed (a copy of the socket that took the stream's head for
        an answer still owed would eat 112 bytes of it).
    nbprobe.py client HOST PORT echo|banner
        The same with a blocking socket (`connect` must succeed): prints `CONNECTED`, then
        `INTACT` or what differed.
"""
import errno
import select
import signal
import socket
import struct
import sys
import time

PAYLOAD = 1 << 20
# The head of an answer to a PROPOSAL (spec/WIRE.md section 11) 4 bytes into the banner.
MAGIC_BANNER = b"ABCD" + b"\0COLO-NS" + bytes(range(200)) * 2


def pattern(n, start=0):
    # A period of 251 bytes: bytes lost, added or shifted (a 112-byte answer) do not line up.
    return bytes((start + i) % 251 for i in range(n))


def name(e):
    return errno.errorcode.get(e, str(e)) if e else "0"


def recv_exactly(s, n):
    got = bytearray()
    while len(got) < n:
        try:
            b = s.recv(min(65536, n - len(got)))
        except BlockingIOError:
            select.select([s], [], [], 10)
            continue
        if not b:
            break
        got += b
    return bytes(got)


def send_all(s, data):
    view = memoryview(data)
    while view:
        try:
            n = s.send(view[:65536])
        except BlockingIOError:
            select.select([], [s], [], 10)
            continue
        view = view[n:]


def serve(port, delay, mode):
    signal.alarm(300)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", int(port)))
    ls.listen(64)
    print("READY", flush=True)
    while True:
        # Late by DELAY from the connection's arrival (the listener reported readable).
        select.select([ls], [], [])
        time.sleep(float(delay))
        c, _ = ls.accept()
        c.settimeout(20)
        try:
            if mode == "banner":
                c.sendall(pattern(PAYLOAD, 7))
            elif mode == "magic":
                c.sendall(MAGIC_BANNER)
            n = struct.unpack("!I", recv_exactly(c, 4))[0]
            c.sendall(recv_exactly(c, n))
        except (OSError, struct.error) as e:
            print("server:", e, flush=True)
        c.close()


def exchange(s, mode):
    """The client's side of `serve`: what differed, or `INTACT`."""
    if mode == "banner":
        banner = recv_exactly(s, PAYLOAD)
        if banner != pattern(PAYLOAD, 7):
            return "BANNER %d bytes, first %r" % (len(banner), banner[:16])
    data = pattern(PAYLOAD, 3)
    send_all(s, struct.pack("!I", len(data)) + data)
    back = recv_exactly(s, len(data))
    if back != data:
        return "ECHO %d bytes, first %r" % (len(back), back[:16])
    return "INTACT"


def decided(s, mode, out):
    """A connect reported done: `SO_ERROR`'s name, then, if none, the exchange's outcome."""
    e = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    out.append(name(e))
    if e == 0:
        out.append(exchange(s, mode))


def connected(host, port):
    """A blocking connect with a 20 s timeout; None (and `CONNECT errno` printed) if it failed."""
    s = socket.socket()
    try:
        s.connect((host, int(port)))
    except OSError as e:
        print("CONNECT", name(e.errno), flush=True)
        return None
    s.settimeout(20)
    return s


def nbclient(host, port, mode):
    signal.alarm(60)
    s = socket.socket()
    s.setblocking(False)
    r = s.connect_ex((host, int(port)))
    out = [name(r)]
    p = select.poll()
    p.register(s, select.POLLOUT)
    if not p.poll(10000):
        out.append("NOPOLLOUT")
    else:
        decided(s, mode, out)
    print(" ".join(out), flush=True)


def client(host, port, mode):
    signal.alarm(60)
    s = connected(host, port)
    if s is None:
        return
    print("CONNECTED", exchange(s, mode), flush=True)


def dupclient(host, port):
    import os
    signal.alarm(60)
    s = connected(host, port)
    if s is None:
        return
    d = os.dup(s.fileno())  # non-blocking, as the socket with a timeout
    head = b""
    while not head:
        select.select([d], [], [], 10)
        try:
            head = os.read(d, 4)
        except BlockingIOError:
            pass
    rest = recv_exactly(s, len(MAGIC_BANNER) - 4)
    got = head + rest
    print("CONNECTED", "INTACT" if got == MAGIC_BANNER else "GOT %d bytes, first %r" % (len(got), got[:16]), flush=True)


def pollzero(host, port, mode):
    signal.alarm(60)
    s = socket.socket()
    s.setblocking(False)
    out = [name(s.connect_ex((host, int(port))))]
    p = select.poll()
    p.register(s, select.POLLOUT)
    empty = 0
    while not p.poll(0):
        empty += 1
        time.sleep(0.001)
    out.append("NOTYET" if empty else "DECIDED")
    decided(s, mode, out)
    print(" ".join(out), flush=True)


def aioclient(host, port, mode):
    import asyncio
    signal.alarm(60)

    async def run():
        r, w = await asyncio.open_connection(host, int(port))
        out = ["CONNECTED"]
        if mode == "banner":
            banner = await r.readexactly(PAYLOAD)
            if banner != pattern(PAYLOAD, 7):
                out.append("BANNER %d bytes, first %r" % (len(banner), banner[:16]))
                return out
        data = pattern(PAYLOAD, 3)
        w.write(struct.pack("!I", len(data)) + data)
        await w.drain()
        back = await r.readexactly(len(data))
        out.append("INTACT" if back == data else "ECHO %d bytes, first %r" % (len(back), back[:16]))
        w.close()
        return out

    print(" ".join(asyncio.run(run())), flush=True)


if __name__ == "__main__":
    {"serve": serve, "nbclient": nbclient, "pollzero": pollzero, "client": client, "aioclient": aioclient, "dupclient": dupclient}[sys.argv[1]](*sys.argv[2:])
