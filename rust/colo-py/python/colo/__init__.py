"""colo: same-host connections through shared memory, with socket semantics and a TCP fallback.

    import colo
    with colo.listen("127.0.0.1:7000") as ln:
        conn, addr = ln.accept()
        data = conn.recv(65536)

A ``Conn`` behaves like a connected ``socket.socket`` (recv, recv_into, send, sendall, shutdown,
close, settimeout, setblocking, fileno, makefile, context manager). Between two processes on this
host it moves bytes through shared memory; to anything else it is plain TCP (``conn.transport``).

Zero-copy messages: ``loan = conn.loan(n)`` is a writable buffer in the shared segment (fill it
through ``memoryview(loan)``, then ``loan.send()``); ``msg = conn.recv_message()`` is a read-only
buffer over the sender's bytes, read in place (``memoryview(msg)``), returned to the sender by
``msg.release()`` or a ``with`` block. Every call that may wait releases the GIL.
"""

from __future__ import annotations

import socket as _socket
from typing import Optional, Tuple, Union

from ._colo import Conn, Listener, Loan, Message, __version__, connect, listen

__all__ = [
    "Conn",
    "Listener",
    "Loan",
    "Message",
    "connect",
    "create_connection",
    "listen",
    "__version__",
]

_DEFAULT = getattr(_socket, "_GLOBAL_DEFAULT_TIMEOUT", object())


def create_connection(
    address: Tuple[str, int],
    timeout: Union[float, None, object] = _DEFAULT,
    source_address: Optional[Tuple[str, int]] = None,
    **options: int,
) -> Conn:
    """``socket.create_connection`` for colo: connect to ``(host, port)``.

    ``timeout`` (seconds) applies to the connection's operations, as with ``socket``; the
    default is ``socket.getdefaulttimeout()``. ``source_address`` is not supported (a colo
    connection to a local listener has no TCP source port). ``options`` are passed to
    ``connect`` (``ring_capacity``, ``slot_size``, ``slot_count``, ``spin_us``).
    """
    if source_address is not None:
        raise ValueError("colo.create_connection does not support source_address")
    if timeout is _DEFAULT:
        timeout = _socket.getdefaulttimeout()
    return connect(address, timeout, **options)  # type: ignore[arg-type]
