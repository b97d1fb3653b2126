"""Asks the rendezvous of root's server for the offers of connections to its port (spec/WIRE.md
section 3, "Offers for another process's listener"), as a process listening on the same address
with SO_REUSEPORT would: for tests/attack/t_rt_ask.sh, run as nobody (must get nothing) and as
root (the control: the same asks get descriptors while an offer is held for an accepted
connection).

usage: ask_thief.py SERVER_PORT SECONDS OUTFILE
writes ASKED/ANSWER/STOLE lines to OUTFILE.
"""
import socket
import struct
import sys
import time

port, seconds, outfile = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
out = open(outfile, "a", buffering=1)
name = b"\0colo/1/127.0.0.1:%d" % port


def keys():
    """Established connections to the port, as `client|server`."""
    found = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        parts = line.split()
        if parts[3] != "01":  # ESTABLISHED
            continue

        def addr(a):
            ip, p = a.split(":")
            return "%s:%d" % (socket.inet_ntoa(struct.pack("<I", int(ip, 16))), int(p, 16))

        local, remote = addr(parts[1]), addr(parts[2])
        if local.endswith(":%d" % port):
            found.add("%s|%s" % (remote, local))
    return found


asked = set()
end = time.time() + seconds
while time.time() < end:
    for k in keys():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.settimeout(0.2)
        try:
            s.connect(name)
            s.send(struct.pack("<IBBBBII", 0x4F4C4F43, 4, 1, 0, 0, 0, 0) + k.encode())
            msg, fds, _, _ = socket.recv_fds(s, 64, 8)
        except OSError as e:
            s.close()
            continue
        if k not in asked:
            asked.add(k)
            out.write("ASKED %s\n" % k)
        out.write("ANSWER %r\n" % msg)
        if fds:
            out.write("STOLE %d descriptors for %s: %r\n" % (len(fds), k, msg))
        s.close()
    time.sleep(0.01)
