import os
import subprocess
import sys
from typing import Iterator, List

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


class Server:
    """A server in a separate process, started from a script that prints `READY host:port`."""

    def __init__(self, args: List[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=HERE)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("READY "):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r} {self.proc.stderr.read()!r}")  # type: ignore[union-attr]
        self.addr = line.split()[1]
        host, port = self.addr.rsplit(":", 1)
        self.host, self.port = host, int(port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def spawn() -> Iterator:
    started: List[Server] = []

    def start(*args: str) -> Server:
        s = Server(list(args))
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def stream_server(spawn):
    return spawn("peer.py", "server", "127.0.0.1:0", "stream")


@pytest.fixture
def msg_server(spawn):
    return spawn("peer.py", "server", "127.0.0.1:0", "msg")


def in_memfd_mapping(addr: int) -> bool:
    """Whether `addr` lies in a memfd mapping of this process (a shared segment)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                return "memfd:" in line
    return False


@pytest.fixture(autouse=True)
def watchdog():
    """No test may hang: dump the stacks and exit after 60 s."""
    import faulthandler

    faulthandler.dump_traceback_later(60, exit=True, file=sys.__stderr__)
    yield
    faulthandler.cancel_dump_traceback_later()
