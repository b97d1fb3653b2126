"""ZeroMQ REQ/REP for tests/apps/zmq_bench.sh. `server PORT`: a REP socket that echoes until it
gets b"quit". `client PORT N [quit]`: N round trips of 64 B after 200 unmeasured ones, prints the
round trips per second, then (with a fourth argument) stops the server."""
import sys, time, zmq
mode, port = sys.argv[1], sys.argv[2]
ctx = zmq.Context()
if mode == "server":
    s = ctx.socket(zmq.REP); s.bind(f"tcp://127.0.0.1:{port}")
    while True:
        m = s.recv()
        s.send(m)
        if m == b"quit": break
else:
    n = int(sys.argv[3]); s = ctx.socket(zmq.REQ); s.connect(f"tcp://127.0.0.1:{port}")
    msg = b"x" * 64
    for _ in range(200): s.send(msg); s.recv()
    t = time.perf_counter()
    for _ in range(n): s.send(msg); s.recv()
    dt = time.perf_counter() - t
    print(f"{n/dt:.0f}")
    if len(sys.argv) > 4: s.send(b"quit"); s.recv()
