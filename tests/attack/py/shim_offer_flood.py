"""Attacker (run as nobody) for tests/attack/t_shim_offer_bound.sh: fills a shim listener's
offer service with offers nobody will accept.

usage: shim_offer_flood.py PORT COUNT MODE SECONDS OUTFILE [FIRST_CLIENT_PORT]
  MODE hello: COUNT well-formed CARRIER HELLOs, each with its own segment (a distinct 4-tuple
              from a TCP port that never connects);
  MODE silent: COUNT rendezvous connections that never send a HELLO;
  MODE dup: COUNT HELLOs that all name the same 4-tuple.
Keeps every control socket open for SECONDS (so nothing is freed by a hang-up), then writes to
OUTFILE: "SENT n", "REJECTED_NO_RESOURCES n" (answers REJECT(NO_RESOURCES) read),
"REJECTED_NOT_CLAIMED n", "CLOSED_BY_SERVER n" (connections the server closed), "CLOSED_AT_ONCE n"
(of those, closed within 4 s of the flood's start, before any offer's 5 s timer can end:
refusals whose HELLO reached the service between its look for one and its close, which the
client sees as a reset before the REJECT; a loaded host delays them by seconds) and the times
they were first seen ("FIRST_CLOSE_AFTER": the first close after those 4 s).
"""
import fcntl
import os
import select
import socket
import struct
import sys
import time

port, count, mode, seconds, outfile = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5]
first_port = int(sys.argv[6]) if len(sys.argv) > 6 else 20001
name = b"\0colo/1/127.0.0.1:%d" % port
RING = 4096
HEADER = 1024  # spec/WIRE.md section 4
SEGMENT = HEADER + 2 * 8192  # header + two blocks (ring 4096, no pool)


def addr(port_):
    return struct.pack("<HH", 4, port_) + socket.inet_aton("127.0.0.1") + bytes(12) + bytes(4)


def header(client_port):
    h = b"COLOSEG\0" + struct.pack("<IIQIIIIII", 1, HEADER, SEGMENT, RING, 0, 0, 1, os.getpid(), 0)
    return h + addr(client_port) + addr(port)


hello = struct.pack("<IBBBBII", 0x4F4C4F43, 1, 1, 2, 0, 0, 0)
socks = []
t0 = time.time()
for i in range(count):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(name)
    except OSError as e:
        print("connect %d: %s" % (i, e), file=sys.stderr)
        s.close()
        continue
    if mode in ("hello", "dup"):
        m = os.memfd_create("colo-seg", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(m, SEGMENT)
        os.pwrite(m, header(first_port + (0 if mode == "dup" else 2 * i)), 0)
        for base in (HEADER, HEADER + 8192):  # both rings start at 2048 bytes (spec/WIRE.md section 5)
            os.pwrite(m, struct.pack("<I", 2048), base + 12)
        # Sealed as an honest client's (a server reads no segment whose size can change).
        fcntl.fcntl(m, 1033, 1 | 2 | 4)  # F_ADD_SEALS: F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW
        try:
            socket.send_fds(s, [hello], [m])
        except OSError:
            pass  # refused (and closed) before the HELLO went: the answer is still to be read
        os.close(m)
    s.setblocking(False)
    socks.append(s)

rejected = not_claimed = closed = at_once = 0
first_reject = first_close = None
done = set()
end = t0 + seconds
while time.time() < end and len(done) < len(socks):
    p = select.poll()
    index = {}
    for i, s in enumerate(socks):
        if i not in done:
            p.register(s, select.POLLIN)
            index[s.fileno()] = i
    for fd, ev in p.poll(200):
        i = index[fd]
        try:
            b = socks[i].recv(64)
        except OSError:
            b = b""
        if len(b) == 16 and b[4] == 3 and b[6] == 6:
            rejected += 1
            first_reject = first_reject or time.time() - t0
        elif len(b) == 16 and b[4] == 3 and b[6] == 5:
            not_claimed += 1
        elif not b:
            closed += 1
            age = time.time() - t0
            if age < 4.0:
                at_once += 1
            else:
                first_close = first_close or age
        done.add(i)
with open(outfile, "a") as f:
    f.write("SENT %d\nREJECTED_NO_RESOURCES %d\nREJECTED_NOT_CLAIMED %d\nCLOSED_BY_SERVER %d\n" % (len(socks), rejected, not_claimed, closed))
    f.write("CLOSED_AT_ONCE %d\n" % at_once)
    f.write("FIRST_CLOSE_AFTER %.2f\n" % (first_close or -1))
