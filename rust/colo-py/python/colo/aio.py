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
from typing import Any, List, Optional, Tuple

from ._colo import Conn, Listener, Message
from ._colo import connect as _connect
from ._colo import listen as _listen


class _Waiters:
    """Futures waiting for one fd. asyncio keeps one reader callback per fd, and a connection's
    readers and writers (over shared memory) all wait on its readiness fd, so they share one
    registration: readiness wakes every waiter, and each retries its call.

    A call that finds nothing to do drains the doorbell behind the readiness fd, so with two
    different calls waiting (a reader and a writer), one's retry may swallow the wake-up meant for
    the other: the connection says so (``take_swallowed``), and the caller then wakes every
    waiter to retry (``wake_all``)."""

    def __init__(self) -> None:
        self._futs: List["asyncio.Future[None]"] = []
        self._fd = -1
        self._write = False

    async def wait(self, fd: int, write: bool = False) -> None:
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[None]" = loop.create_future()
        if not self._futs:
            self._fd, self._write = fd, write
            (loop.add_writer if write else loop.add_reader)(fd, self._wake)
        self._futs.append(fut)
        try:
            await fut
        finally:
            if fut in self._futs:
                self._futs.remove(fut)
                if not self._futs:
                    self._unregister()

    def _unregister(self) -> None:
        loop = asyncio.get_running_loop()
        (loop.remove_writer if self._write else loop.remove_reader)(self._fd)

    def wake_all(self) -> None:
        """Makes every waiter retry its call."""
        if self._futs:
            self._wake()

    def _wake(self) -> None:
        futs, self._futs = self._futs, []
        self._unregister()
        for f in futs:
            if not f.done():
                f.set_result(None)


class AsyncConn:
    """A ``colo.Conn`` driven by the asyncio event loop."""

    def __init__(self, conn: Conn) -> None:
        conn.setblocking(False)
        self.conn = conn
        self._tcp = conn.transport == "tcp"
        self._readers = _Waiters()
        self._writers = _Waiters() if self._tcp else self._readers

    @property
    def transport(self) -> str:
        return self.conn.transport

    def _wake_others(self) -> None:
        if not self._tcp and self.conn.take_swallowed():
            # Our call drained a wake-up that may have been another waiter's: let them all retry.
            self._readers.wake_all()

    async def _retry(self, op: Any, *args: Any, write: bool = False) -> Any:
        while True:
            try:
                result = op(*args)
            except BlockingIOError:
                self._wake_others()
                if write and self._tcp:
                    await self._writers.wait(self.conn.fileno(), write=True)
                else:
                    await self._readers.wait(self.conn.fileno())
                continue
            self._wake_others()
            return result

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
        self._waiters = _Waiters()

    @property
    def address(self) -> str:
        return self.listener.address

    async def accept(self) -> Tuple[AsyncConn, Tuple[str, int]]:
        while True:
            try:
                conn, addr = self.listener.accept()
                return AsyncConn(conn), addr
            except BlockingIOError:
                await self._waiters.wait(self.listener.fileno())

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
