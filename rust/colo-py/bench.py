"""colo vs the standard socket module, from Python, in one run.

    python bench.py [--seconds S] [--repeat N]

Cases: 64 B echo round trip (p50/p99 per run) and 64 KiB streaming (MB/s), through colo (shared
memory; default spin and spin never), TCP loopback and Unix sockets with the socket module. Every
server is a separate Python process. Ratios compare medians over --repeat runs of this one run.
"""

import argparse
import os
import socket
import statistics
import struct
import subprocess
import sys
import time

import colo

MSG = 64
CHUNK = 64 * 1024


def serve(kind: str, op: str, spin: str) -> None:
    if kind == "colo":
        opts = {} if spin == "default" else {"spin_us": int(spin)}
        ln = colo.listen("127.0.0.1:0", **opts)
        print(f"READY {ln.address}", flush=True)
        c, _ = ln.accept()
    elif kind == "tcp":
        ls = socket.create_server(("127.0.0.1", 0))
        print(f"READY 127.0.0.1:{ls.getsockname()[1]}", flush=True)
        c, _ = ls.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    else:
        path = f"/tmp/colo-pybench-{os.getpid()}.sock"
        ls = socket.socket(socket.AF_UNIX)
        ls.bind(path)
        ls.listen()
        print(f"READY {path}", flush=True)
        c, _ = ls.accept()
        os.unlink(path)
    buf = bytearray(CHUNK)
    if op == "echo":
        while True:
            n = c.recv_into(buf)
            if not n:
                return
            c.sendall(memoryview(buf)[:n])
    total = 0
    while True:
        n = c.recv_into(buf)
        if not n:
            c.sendall(struct.pack("<Q", total))
            return
        total += n


def start(kind: str, op: str, spin: str = "default"):
    p = subprocess.Popen([sys.executable, __file__, "--serve", kind, op, spin], stdout=subprocess.PIPE, text=True)
    addr = p.stdout.readline().split()[1]
    if kind == "colo":
        opts = {} if spin == "default" else {"spin_us": int(spin)}
        c = colo.connect(addr, **opts)
        assert c.transport == "colo"
    elif kind == "tcp":
        host, port = addr.rsplit(":", 1)
        c = socket.create_connection((host, int(port)))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    else:
        c = socket.socket(socket.AF_UNIX)
        c.connect(addr)
    return p, c


def round_trip(kind: str, spin: str, seconds: float):
    p, c = start(kind, "echo", spin)
    msg = b"x" * MSG
    buf = bytearray(MSG)
    samples = []
    clock = time.perf_counter_ns
    warm = time.perf_counter() + seconds / 5
    end = time.perf_counter() + seconds
    while True:
        t0 = clock()
        c.sendall(msg)
        got = 0
        while got < MSG:
            got += c.recv_into(memoryview(buf)[got:])
        t1 = clock()
        now = t1 / 1e9
        if now > end:
            break
        if time.perf_counter() > warm:
            samples.append(t1 - t0)
    c.close()
    p.wait(10)
    samples.sort()
    return samples[len(samples) // 2] / 1000, samples[len(samples) * 99 // 100] / 1000


def streaming(kind: str, spin: str, seconds: float) -> float:
    p, c = start(kind, "sink", spin)
    chunk = b"y" * CHUNK
    sent = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(16):
            c.sendall(chunk)
        sent += 16 * CHUNK
    c.shutdown(socket.SHUT_WR)
    got = b""
    while len(got) < 8:
        got += c.recv(8 - len(got))
    dt = time.perf_counter() - t0
    assert struct.unpack("<Q", got)[0] == sent
    c.close()
    p.wait(10)
    return sent / dt / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--serve", nargs=3)
    a = ap.parse_args()
    if a.serve:
        serve(*a.serve)
        return
    cases = [("socket tcp", "tcp", "default"), ("socket unix", "unix", "default"),
             ("colo", "colo", "default"), ("colo (spin never)", "colo", "0")]
    print(f"colo {colo.__version__} Python bench: {a.repeat} runs x {a.seconds} s per case, "
          f"Python {sys.version.split()[0]}\n")
    print("64 B echo round trip (medians of the runs' p50 / p99)")
    print(f"  {'transport':<20} {'p50 us':>9} {'p99 us':>9} {'spread p50':>14} {'x TCP':>8}")
    rtt = {}
    for name, kind, spin in cases:
        runs = [round_trip(kind, spin, a.seconds) for _ in range(a.repeat)]
        p50 = statistics.median(r[0] for r in runs)
        p99 = statistics.median(r[1] for r in runs)
        rtt[name] = p50
        lo, hi = min(r[0] for r in runs), max(r[0] for r in runs)
        print(f"  {name:<20} {p50:9.2f} {p99:9.2f} {lo:6.2f}-{hi:<7.2f} {rtt['socket tcp'] / p50:7.2f}x", flush=True)
    print("\n64 KiB sendall, streaming (median MB/s)")
    print(f"  {'transport':<20} {'MB/s':>9} {'spread':>14} {'x TCP':>8}")
    tput = {}
    for name, kind, spin in cases[:3]:
        runs = [streaming(kind, spin, a.seconds) for _ in range(a.repeat)]
        m = statistics.median(runs)
        tput[name] = m
        print(f"  {name:<20} {m:9.0f} {min(runs):6.0f}-{max(runs):<7.0f} {m / tput['socket tcp']:7.2f}x", flush=True)
    print(f"\nratios (colo over socket TCP): round trip {rtt['socket tcp'] / rtt['colo']:.2f}x faster, "
          f"streaming {tput['colo'] / tput['socket tcp']:.2f}x")


if __name__ == "__main__":
    main()
