"""``Conn.makefile``: file objects over a colo connection, layered as ``socket.makefile`` does."""

from __future__ import annotations

import errno
import io
from typing import Any, Optional

_BLOCKING = {errno.EAGAIN, errno.EWOULDBLOCK}


class ConnIO(io.RawIOBase):
    """A raw I/O object over a ``colo.Conn`` (like ``socket.SocketIO``)."""

    def __init__(self, conn: Any, mode: str) -> None:
        if mode not in ("r", "w", "rw", "rb", "wb", "rwb"):
            raise ValueError(f"invalid mode: {mode!r}")
        super().__init__()
        self._conn = conn
        if "b" not in mode:
            mode += "b"
        self._mode = mode
        self._reading = "r" in mode
        self._writing = "w" in mode
        conn._io_ref()

    def readinto(self, b: Any) -> Optional[int]:
        self._checkClosed()
        self._checkReadable()
        try:
            return self._conn.recv_into(b)
        except BlockingIOError:
            return None

    def write(self, b: Any) -> Optional[int]:
        self._checkClosed()
        self._checkWritable()
        try:
            return self._conn.send(b)
        except BlockingIOError:
            return None

    def readable(self) -> bool:
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        return self._reading

    def writable(self) -> bool:
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        return self._writing

    def seekable(self) -> bool:
        return False

    def fileno(self) -> int:
        self._checkClosed()
        return self._conn.fileno()

    @property
    def name(self) -> int:
        return -1 if self.closed else self.fileno()

    @property
    def mode(self) -> str:
        return self._mode

    def close(self) -> None:
        # Like socket.makefile: closing the file does not close the connection, but completes a
        # conn.close() called while the file was open.
        if self.closed:
            return
        io.RawIOBase.close(self)
        self._conn._io_unref()
        self._conn = None


def makefile(conn: Any, mode: str = "r", buffering: Optional[int] = None, encoding: Optional[str] = None,
             errors: Optional[str] = None, newline: Optional[str] = None) -> Any:
    if not set(mode) <= {"r", "w", "b"}:
        raise ValueError(f"invalid mode {mode!r} (only r, w, b allowed)")
    writing = "w" in mode
    reading = "r" in mode or not writing
    assert reading or writing
    binary = "b" in mode
    rawmode = ""
    if reading:
        rawmode += "r"
    if writing:
        rawmode += "w"
    raw = ConnIO(conn, rawmode)
    if buffering is None:
        buffering = -1
    if buffering < 0:
        buffering = io.DEFAULT_BUFFER_SIZE
    if buffering == 0:
        if not binary:
            raise ValueError("unbuffered streams must be binary")
        return raw
    buffer: Any
    if reading and writing:
        buffer = io.BufferedRWPair(raw, raw, buffering)
    elif reading:
        buffer = io.BufferedReader(raw, buffering)
    else:
        buffer = io.BufferedWriter(raw, buffering)
    if binary:
        return buffer
    text = io.TextIOWrapper(buffer, encoding, errors, newline)
    text.mode = mode  # type: ignore[misc]
    return text
