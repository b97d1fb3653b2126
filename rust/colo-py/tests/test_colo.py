"""colo's Python package against servers in separate processes: streams, half-close, TCP fallback
both ways, peer death, bad input, timeouts, zero-copy messages (measured: no copy), makefile,
asyncio, and the GIL released while blocked."""

import asyncio
import errno
import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc

import pytest

import colo
import colo.aio
from conftest import HERE, in_memfd_mapping


def recv_all(c, n=None):
    out = bytearray()
    while n is None or len(out) < n:
        d = c.recv(1 << 16)
        if not d:
            break
        out += d
    return bytes(out)


# ---- streams ---------------------------------------------------------------------------------------

def test_stream_echo_between_processes(stream_server):
    data = os.urandom(3 << 20)
    with colo.connect(stream_server.addr) as c:
        assert c.transport == "colo"
        assert c.getpeername() == (stream_server.host, stream_server.port)
        got = bytearray()

        def reader():
            got.extend(recv_all(c))

        t = threading.Thread(target=reader)
        t.start()
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        t.join(30)
        assert bytes(got) == data


def test_recv_into_send_and_peek(stream_server):
    with colo.create_connection((stream_server.host, stream_server.port), timeout=10) as c:
        assert c.gettimeout() == 10
        n = c.send(b"abcdef")
        assert 1 <= n <= 6
        c.sendall(b"abcdef"[n:])
        time.sleep(0.05)
        assert c.recv(3, socket.MSG_PEEK) == b"abc"
        buf = bytearray(16)
        got = 0
        while got < 6:
            got += c.recv_into(memoryview(buf)[got:])
        assert buf[:6] == b"abcdef"


def test_halfclose(stream_server):
    with colo.connect(stream_server.addr) as c:
        c.sendall(b"hello")
        c.shutdown(socket.SHUT_WR)
        assert recv_all(c) == b"hello"  # the server answered after our FIN, then closed
        with pytest.raises(BrokenPipeError):
            c.sendall(b"more")


def test_python_peer_as_client(stream_server, msg_server):
    peer = os.path.join(HERE, "peer.py")
    out = subprocess.run([sys.executable, peer, "client", stream_server.addr, "stream", "1000000"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "OK 1000000 colo", out.stderr
    out = subprocess.run([sys.executable, peer, "client", msg_server.addr, "msg", "50", "65536"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "OK 50 colo", out.stderr


# ---- TCP fallback --------------------------------------------------------------------------------

def test_fallback_to_plain_tcp_server(spawn):
    srv = spawn("helper.py", "tcp-echo")
    with colo.connect((srv.host, srv.port)) as c:
        assert c.transport == "tcp"
        c.sendall(b"over tcp")
        assert recv_all(c, 8) == b"over tcp"
        # messages are framed on the stream over TCP; the echo server returns the frame
        loan = c.loan(5)
        assert not loan.zero_copy
        with memoryview(loan) as v:
            v[:] = b"hello"
        loan.send()
        m = c.recv_message()
        assert m is not None and not m.zero_copy and bytes(m) == b"hello"
        m.release()


def test_plain_socket_client_reaches_colo_listener(stream_server):
    with socket.create_connection((stream_server.host, stream_server.port), timeout=10) as s:
        s.sendall(b"plain")
        s.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            d = s.recv(100)
            if not d:
                break
            got += d
        assert got == b"plain"


def test_colo_listener_accepts_plain_tcp():
    with colo.listen("127.0.0.1:0") as ln:
        host, port = ln.getsockname()
        code = f"import socket; s = socket.create_connection(('{host}', {port})); s.sendall(b'hi'); s.close()"
        p = subprocess.Popen([sys.executable, "-c", code])
        c, addr = ln.accept()
        with c:
            assert c.transport == "tcp" and addr[0] == "127.0.0.1" and addr[1] > 0
            assert recv_all(c) == b"hi"
        p.wait(10)


# ---- failures ------------------------------------------------------------------------------------

def test_peer_death_gives_eof_or_reset_in_bounded_time(spawn):
    srv = spawn("helper.py", "hang")
    c = colo.connect(srv.addr)
    assert c.transport == "colo"
    assert recv_all(c, 5) == b"ready"
    m = c.recv_message()
    assert bytes(m) == b"msg!"
    c.settimeout(10)  # a guard: a death never seen raises TimeoutError here
    os.kill(srv.proc.pid, signal.SIGKILL)
    try:
        assert c.recv(100) == b""
    except ConnectionResetError:
        pass
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        c.sendall(b"x")
    assert bytes(m) == b"msg!"  # a message we hold stays readable after the peer died
    m.release()
    c.close()


def test_closed_conn_raises_ebadf(stream_server):
    c = colo.connect(stream_server.addr)
    c.close()
    c.close()  # idempotent
    assert c.closed and c.fileno() == -1
    for call in (lambda: c.recv(1), lambda: c.recv_into(bytearray(1)), lambda: c.send(b"x"),
                 lambda: c.sendall(b"x"), lambda: c.shutdown(socket.SHUT_RDWR), lambda: c.settimeout(1),
                 lambda: c.loan(1), lambda: c.recv_message(), lambda: c.getpeername(), lambda: c.transport):
        with pytest.raises(OSError) as e:
            call()
        assert e.value.errno == errno.EBADF
    ln = colo.listen("127.0.0.1:0")
    ln.close()
    with pytest.raises(OSError) as e:
        ln.accept()
    assert e.value.errno == errno.EBADF
    assert ln.fileno() == -1


def test_bad_input(stream_server):
    with colo.connect(stream_server.addr) as c:
        with pytest.raises(ValueError):
            c.recv(-1)
        with pytest.raises(ValueError):
            c.shutdown(7)
        with pytest.raises(ValueError):
            c.settimeout(-1)
        with pytest.raises(TypeError):
            c.recv_into(b"read-only")
        with pytest.raises(ValueError):
            c.recv_into(bytearray(4), 8)
        with pytest.raises(TypeError):
            c.send("text, not bytes")
        with pytest.raises(OSError) as e:
            c.loan(c.max_message_size + 1)
        assert e.value.errno == errno.EMSGSIZE
    with pytest.raises(TypeError):
        colo.connect(12345)
    with pytest.raises(socket.gaierror):
        colo.listen("not an address")
    with pytest.raises(socket.gaierror):
        colo.connect("127.0.0.1:99999")
    with pytest.raises(OverflowError):
        colo.connect(("127.0.0.1", 99999))
    with pytest.raises(ValueError):
        colo.listen("127.0.0.1:0", ring_capacity=5000)
    with pytest.raises(ValueError):
        colo.listen("127.0.0.1:0", slot_size=4096, slot_count=0)
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with pytest.raises(ConnectionRefusedError):
        colo.connect(("127.0.0.1", port))


def test_timeouts_and_nonblocking(stream_server):
    with colo.connect(stream_server.addr) as c:
        c.settimeout(0.1)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            c.recv(10)
        assert time.monotonic() - t0 >= 0.09
        c.setblocking(False)
        assert c.gettimeout() == 0.0
        with pytest.raises(BlockingIOError):
            c.recv(10)
        c.setblocking(True)
        assert c.gettimeout() is None
        c.sendall(b"back")
        assert recv_all(c, 4) == b"back"


def test_makefile(stream_server):
    with colo.connect(stream_server.addr) as c:
        f = c.makefile("rw", encoding="utf-8", newline="\n")
        f.write("first line\nsecond line\n")
        f.flush()
        assert f.readline() == "first line\n"
        assert f.readline() == "second line\n"
        f.close()
        assert not c.closed  # like socket.makefile: the file does not own the connection
        b = c.makefile("rwb", buffering=0)
        b.write(b"raw")
        assert b.read(3) == b"raw"


# ---- zero-copy messages --------------------------------------------------------------------------

def buffer_address(obj) -> int:
    """The address CPython's buffer protocol hands out for `obj` (via ctypes)."""
    import ctypes

    class Py_buffer(ctypes.Structure):
        _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                    ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                    ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                    ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]

    view = Py_buffer()
    ctypes.pythonapi.PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(Py_buffer), ctypes.c_int]
    ctypes.pythonapi.PyBuffer_Release.argtypes = [ctypes.POINTER(Py_buffer)]
    assert ctypes.pythonapi.PyObject_GetBuffer(obj, ctypes.byref(view), 0) == 0
    try:
        return view.buf
    finally:
        ctypes.pythonapi.PyBuffer_Release(ctypes.byref(view))


def test_one_mib_message_is_not_copied(msg_server):
    size = 1 << 20
    payload = os.urandom(size)
    digest = hashlib.sha256(payload).digest()
    with colo.connect(msg_server.addr, slot_size=4 << 20, slot_count=8) as c:
        loan = c.loan(size)
        assert loan.zero_copy and len(loan) == size and loan.capacity >= size
        assert in_memfd_mapping(loan.address)          # the buffer is in the shared segment
        with memoryview(loan) as v:
            assert not v.readonly
            assert buffer_address(v) == loan.address   # and Python writes it in place
            v[:] = payload
        loan.send()

        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            m = c.recv_message()
            v = memoryview(m)
            echoed = hashlib.sha256(v).digest()        # reads all 1 MiB in place
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
        assert echoed == digest
        assert peak < 64 * 1024, f"{peak} bytes allocated while receiving 1 MiB"
        assert m.zero_copy and len(m) == size
        assert buffer_address(v) == m.address and in_memfd_mapping(m.address)
        assert v.readonly
        with pytest.raises(TypeError):
            v[0] = 1
        with pytest.raises(BufferError):
            m.release()                                # a view is still exported
        v.release()
        m.release()
        assert m.released
        with pytest.raises(OSError) as e:
            m.release()                                # released twice
        assert e.value.errno == errno.EBADF
        with pytest.raises(BufferError):
            memoryview(m)


def test_loan_lifecycle(msg_server):
    with colo.connect(msg_server.addr) as c:
        loan = c.loan(8)
        v = memoryview(loan)
        with pytest.raises(BufferError):
            loan.send()                                # exported: refuse
        v.release()
        with pytest.raises(ValueError):
            loan.send(loan.capacity + 1)
        with memoryview(loan) as v:
            v[:4] = b"abcd"
        loan.send(4)
        with pytest.raises(OSError):
            loan.send()                                # sent twice
        with c.recv_message() as m:
            assert bytes(m) == b"abcd" and m.tobytes() == b"abcd"
        assert m.released
        with c.loan(16) as unsent:                     # leaving the block cancels it
            pass
        with pytest.raises(BufferError):
            memoryview(unsent)
        # a pool of 16 slots: cancelled and released slots came back
        for i in range(40):
            loan = c.loan(1)
            with memoryview(loan) as v:
                v[0] = i
            loan.send()
            with c.recv_message() as m:
                assert bytes(m) == bytes([i])


# ---- asyncio and the GIL -------------------------------------------------------------------------

def test_asyncio_client_and_server(stream_server):
    async def main():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        t = asyncio.create_task(ticker())
        async with await colo.aio.connect(stream_server.addr) as c:
            assert c.transport == "colo"
            await asyncio.sleep(0.05)                  # the echo waits: the loop keeps ticking
            data = os.urandom(1 << 20)

            async def reader():
                got = bytearray()
                while len(got) < len(data):
                    got += await c.recv(1 << 16)
                return bytes(got)

            r = asyncio.create_task(reader())
            await c.sendall(data)
            assert await r == data
        # an asyncio server, a client in another process
        async with colo.aio.listen("127.0.0.1:0") as ln:
            peer = os.path.join(HERE, "peer.py")
            proc = await asyncio.create_subprocess_exec(sys.executable, peer, "client", ln.address, "halfclose",
                                                        stdout=asyncio.subprocess.PIPE)
            conn, _ = await ln.accept()
            got = b""
            while True:
                d = await conn.recv(100)
                if not d:
                    break
                got += d
            await conn.sendall(got)
            conn.shutdown(socket.SHUT_WR)
            out, _ = await proc.communicate()
            conn.close()
            assert out.decode().strip() == "OK 5 colo"
        stop.set()
        await t
        return ticks

    assert asyncio.run(main()) > 10


def test_gil_released_while_blocked(stream_server):
    with colo.connect(stream_server.addr) as c:
        got = []
        t = threading.Thread(target=lambda: got.append(c.recv(10)))
        t.start()
        time.sleep(0.2)                                 # lets the reader block in recv
        # Python code runs here only if recv let go of the GIL; otherwise the data that would
        # end the recv is never sent and the watchdog ends the test.
        count = sum(1 for _ in range(10000))
        assert count == 10000 and t.is_alive() and got == []
        c.sendall(b"wake")
        t.join(10)
        assert got == [b"wake"]


def test_ctrl_c_interrupts_a_blocked_recv(stream_server):
    import _thread

    with colo.connect(stream_server.addr) as c:
        timer = threading.Timer(0.3, _thread.interrupt_main)  # as if Ctrl-C were pressed
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            c.recv(10)                                  # nothing will ever arrive (watchdog)
        assert time.monotonic() - t0 >= 0.3             # it was the interrupt that ended it
        timer.join()
        c.settimeout(0.35)                              # a deadline longer than one wait slice
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            c.recv(10)
        assert time.monotonic() - t0 >= 0.3             # not before the deadline


# ---- socket semantics found wanting by a new user -----------------------------------------------

def test_close_waits_for_makefile_objects(stream_server):
    c = colo.connect(stream_server.addr)
    f = c.makefile("rwb")
    c.close()  # as with socket: the connection stays open while a file uses it
    f.write(b"still here\n")
    f.flush()
    assert f.readline() == b"still here\n"
    f.close()
    assert c.closed
    with pytest.raises(OSError) as e:
        c.send(b"x")
    assert e.value.errno == errno.EBADF


def test_any_contiguous_buffer_is_bytes(stream_server):
    import array
    with colo.connect(stream_server.addr) as c:
        words = array.array("i", [1, 2, 3])  # item format "i", not bytes: socket takes it
        assert c.send(words) == 12
        got = array.array("i", [0, 0, 0])
        n = c.recv_into(got)
        while n < 12:
            n += c.recv_into(memoryview(got).cast("B")[n:])
        assert got == words
        assert c.send(b"f", socket.MSG_NOSIGNAL) == 1 and recv_all(c, 1) == b"f"
        with pytest.raises(ValueError):
            c.sendall(b"f", socket.MSG_OOB)
        c.sendall(array.array("d", [2.5]))
        back = array.array("d", [0.0])
        n = c.recv_into(back)
        while n < 8:
            n += c.recv_into(memoryview(back).cast("B")[n:])
        assert back[0] == 2.5


def test_timeouts_beyond_what_socket_accepts_are_refused(stream_server):
    with colo.connect(stream_server.addr) as c:
        with pytest.raises(OverflowError):
            c.settimeout(1e19)
        c.settimeout(1e9)  # large but representable: a blocking call still works
        c.sendall(b"ok")
        assert recv_all(c, 2) == b"ok"


def test_create_connection_timeout_bounds_the_connect():
    # A plain listener whose backlog is full: the SYN goes unanswered.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    for _ in range(8):
        f = socket.socket()
        f.setblocking(False)
        f.connect_ex(("127.0.0.1", port))
        fillers.append(f)
    time.sleep(0.2)
    t0 = time.monotonic()
    with pytest.raises((TimeoutError, OSError)):
        colo.create_connection(("127.0.0.1", port), timeout=0.5)
    assert time.monotonic() - t0 < 30
    for f in fillers:
        f.close()
    srv.close()


def test_recv_message_ends_after_own_shutdown_and_send_after_shutdown_fails(msg_server):
    with colo.connect(msg_server.addr) as c:
        loan = c.loan(4)
        c.shutdown(socket.SHUT_WR)
        with pytest.raises(BrokenPipeError):
            loan.send()
        c.shutdown(socket.SHUT_RD)
        c.settimeout(5)
        assert c.recv_message() is None


def test_tcp_fallback_message_survives_timeouts():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    c = colo.connect(("127.0.0.1", port))
    s, _ = srv.accept()
    assert c.transport == "tcp"
    payload = b"A" * 1000 + b"B" * 1000
    s.sendall((2000).to_bytes(4, "little") + payload[:1000])
    c.settimeout(0.3)
    with pytest.raises(TimeoutError):
        c.recv_message()  # half a message: the part read is kept
    s.sendall(payload[1000:] + (5).to_bytes(4, "little") + b"hello")
    with c.recv_message() as m:
        assert bytes(memoryview(m)) == payload
    with c.recv_message() as m:
        assert bytes(memoryview(m)) == b"hello"
    c.close()
    s.close()
    srv.close()


def test_sendall_timeout_bounds_the_whole_call(stream_server):
    # The echo server stops reading once its replies fill our unread direction: sendall waits.
    with colo.connect(stream_server.addr) as c:
        c.settimeout(0.5)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            c.sendall(b"x" * (256 << 20))
        # Per piece, a 0.5 s timeout would let it go on for as long as pieces trickle through.
        assert time.monotonic() - t0 < 10
