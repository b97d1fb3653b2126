"""A client that retries until its server's port answers, then opens the connection it keeps,
must get shared memory for it. Both run under `colo run`; the server binds, waits, then listens
(its TCP listener exists a moment before its colo rendezvous). The client exits 0 when its kept
connection holds a colo segment:

    python3 startup_race.py server PORT &  python3 startup_race.py client PORT
"""
import os, signal, socket, sys, time

role, port = sys.argv[1], int(sys.argv[2])
signal.alarm(10)  # watchdog
if role == "server":
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    time.sleep(0.3)
    s.listen(64)
    s.settimeout(3)
    kept = []
    try:
        while True:
            kept.append(s.accept()[0])
    except OSError:
        sys.exit(0)

while True:  # until the port answers
    probe = socket.socket()
    try:
        probe.connect(("127.0.0.1", port))
        break
    except ConnectionRefusedError:
        probe.close()
probe.close()
kept = socket.create_connection(("127.0.0.1", port))


def segments():
    # Segment mappings (the shim closes a close-on-exec connection's memfd once mapped), each
    # counted by its area at offset 0.
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "colo-seg" in line and int(line.split()[2], 16) == 0)


sys.exit(0 if segments() > 0 else 1)
