"""The cross-language test peer (tests/xlang/PEER.md), Python edition."""

import socket
import sys
import threading

import colo

POOL = dict(slot_size=4 << 20, slot_count=8)
PATTERN = bytes(i % 251 for i in range(251))


def stream_pattern(offset: int, n: int) -> bytes:
    """Bytes offset..offset+n of the stream pattern (byte i is i % 251)."""
    start = offset % 251
    reps = (start + n) // 251 + 1
    return (PATTERN * reps)[start:start + n]


def msg_pattern(k: int, n: int) -> bytes:
    return stream_pattern(k, n)  # byte j of message k is (k + j) % 251


def echo_stream(c: colo.Conn) -> None:
    buf = bytearray(256 * 1024)
    view = memoryview(buf)
    try:
        while True:
            n = c.recv_into(buf)
            if n == 0:
                c.shutdown(socket.SHUT_WR)
                return
            c.sendall(view[:n])
    except OSError as e:
        print(f"peer server: connection: {e}", file=sys.stderr)
    finally:
        c.close()


def echo_messages(c: colo.Conn) -> None:
    try:
        while True:
            m = c.recv_message()
            if m is None:
                return
            with m:
                loan = c.loan(len(m))
                with memoryview(loan) as out, memoryview(m) as inp:
                    out[:] = inp
            loan.send()
    except OSError as e:
        print(f"peer server: connection: {e}", file=sys.stderr)
    finally:
        c.close()


def serve(addr: str, mode: str) -> None:
    ln = colo.listen(addr, **POOL)
    print(f"READY {ln.address}", flush=True)
    target = echo_messages if mode == "msg" else echo_stream
    while True:
        c, _ = ln.accept()
        threading.Thread(target=target, args=(c,), daemon=True).start()


def client_stream(c: colo.Conn, total: int) -> None:
    err = []

    def check() -> None:
        got = 0
        buf = bytearray(256 * 1024)
        try:
            while True:
                n = c.recv_into(buf)
                if n == 0:
                    break
                if buf[:n] != stream_pattern(got, n):
                    err.append(f"mismatch in bytes {got}..{got + n}")
                    return
                got += n
            if got != total:
                err.append(f"echo ended after {got} of {total} bytes")
        except OSError as e:
            err.append(f"read: {e}")

    t = threading.Thread(target=check)
    t.start()
    sent = 0
    chunk = 64 * 1024
    while sent < total:
        n = min(chunk, total - sent)
        c.sendall(stream_pattern(sent, n))
        sent += n
    c.shutdown(socket.SHUT_WR)
    t.join()
    if err:
        raise RuntimeError(err[0])


def client_msg(c: colo.Conn, count: int, size: int) -> None:
    for k in range(count):
        loan = c.loan(size)
        with memoryview(loan) as out:
            out[:] = msg_pattern(k, size)
        loan.send()
        m = c.recv_message()
        if m is None:
            raise RuntimeError("early end of stream")
        with m, memoryview(m) as v:
            if len(v) != size or v != msg_pattern(k, size):
                raise RuntimeError(f"message {k} differs")


def client_halfclose(c: colo.Conn) -> None:
    c.sendall(b"hello")
    c.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        d = c.recv(4096)
        if not d:
            break
        got += d
    if got != b"hello":
        raise RuntimeError(f"got {got!r}")


def usage() -> None:
    print("usage: peer.py server ADDR stream|msg | client ADDR stream BYTES | client ADDR msg COUNT SIZE"
          " | client ADDR halfclose", file=sys.stderr)
    sys.exit(2)


def main(argv: list) -> None:
    if len(argv) < 4:
        usage()
    role, addr, kind = argv[1], argv[2], argv[3]
    if role == "server" and kind in ("stream", "msg"):
        serve(addr, kind)
        return
    if role != "client":
        usage()
    try:
        c = colo.connect(addr, **POOL)
        if kind == "stream" and len(argv) == 5:
            count = int(argv[4])
            client_stream(c, count)
        elif kind == "msg" and len(argv) == 6:
            count = int(argv[4])
            client_msg(c, count, int(argv[5]))
        elif kind == "halfclose":
            count = 5
            client_halfclose(c)
        else:
            usage()
        print(f"OK {count} {c.transport}", flush=True)
        c.close()
    except (OSError, RuntimeError) as e:
        print(f"peer: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv)
