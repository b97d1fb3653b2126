"""asyncio support: await colo connections without threads.

    conn = await colo.aio.connect("127.0.0.1:7000")
    await conn.sendall(b"ping")
    data = await conn.recv(4096)

    async with colo.aio.listen("127.0.0.1:0") as ln:
        conn, addr = await ln.accept()

Each connection runs in non-blocking mode; a call that would block waits for the connection's
readiness fd with ``loop.add_reader`` and retries. The readiness fd of a shared-memory connection
is armed by the call that found nothing to do (it becomes readable at the peer's next progress),
so the pattern "try, on BlockingIOError wait for readable, retry" is exactly right; over TCP the
fd is the socket (writes wait with ``add_writer``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Tuple

from ._colo import Conn, Listener, Message
from ._colo import connect as _connect
from ._colo import listen as _listen


async def _wait_fd(fd: int, write: bool = False) -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    if write:
        loop.add_writer(fd, ready)
    else:
        loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        if write:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


class AsyncConn:
    """A ``colo.Conn`` driven by the asyncio event loop."""

    def __init__(self, conn: Conn) -> None:
        conn.setblocking(False)
        self.conn = conn
        self._tcp = conn.transport == "tcp"

    @property
    def transport(self) -> str:
        return self.conn.transport

    async def _retry(self, op: Any, *args: Any, write: bool = False) -> Any:
        while True:
            try:
                return op(*args)
            except BlockingIOError:
                await _wait_fd(self.conn.fileno(), write=write and self._tcp)

    async def recv(self, bufsize: int) -> bytes:
        return await self._retry(self.conn.recv, bufsize)

    async def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        return await self._retry(self.conn.recv_into, buffer, nbytes)

    async def send(self, data: Any) -> int:
        return await self._retry(self.conn.send, data, write=True)

    async def sendall(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            n = await self.send(view)
            view = view[n:]

    async def recv_message(self) -> Optional[Message]:
        return await self._retry(self.conn.recv_message)

    async def loan(self, size: int) -> Any:
        return await self._retry(self.conn.loan, size, write=True)

    def shutdown(self, how: int) -> None:
        self.conn.shutdown(how)

    def close(self) -> None:
        self.conn.close()

    async def __aenter__(self) -> "AsyncConn":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


class AsyncListener:
    """A ``colo.Listener`` whose ``accept`` is awaited."""

    def __init__(self, listener: Listener) -> None:
        listener.setblocking(False)
        self.listener = listener

    @property
    def address(self) -> str:
        return self.listener.address

    async def accept(self) -> Tuple[AsyncConn, Tuple[str, int]]:
        while True:
            try:
                conn, addr = self.listener.accept()
                return AsyncConn(conn), addr
            except BlockingIOError:
                await _wait_fd(self.listener.fileno())

    def close(self) -> None:
        self.listener.close()

    async def __aenter__(self) -> "AsyncListener":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


async def connect(addr: Any, **options: Any) -> AsyncConn:
    """Connects (the handshake runs in the default executor), then returns an ``AsyncConn``."""
    loop = asyncio.get_running_loop()
    conn = await loop.run_in_executor(None, lambda: _connect(addr, **options))
    return AsyncConn(conn)


def listen(addr: Any, **options: Any) -> AsyncListener:
    """Listens on ``addr``; ``await listener.accept()`` gives ``(AsyncConn, (host, port))``."""
    return AsyncListener(_listen(addr, **options))
