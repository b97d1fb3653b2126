"""A rendezvous squatter (issue 21, finding 3), run as nobody by t_squat.sh.

    squatter.py NAME [DECOY_IP:PORT]

Binds the abstract SOCK_SEQPACKET name NAME (as a colo listener would, e.g. colo/1/127.0.0.1:P)
and, if given, a decoy TCP listener on DECOY_IP:PORT (an address on the same port that it may
own), prints READY, then reports everything it receives: `UNIX CONNECTED`, `UNIX GOT <bytes>
<fds>` for each datagram (with the descriptors it was handed), `TCP GOT <bytes>` on the decoy.
Any `GOT` with a non-zero count means the client sent the squatter something. Handed a
segment, it claims it, answers WELCOME and prints what the client wrote (`SEGMENT ...`).
"""
import array
import mmap
import os
import struct
import time
import select
import socket
import sys

def steal(ctl, memfd):
    """What a squatter handed a segment does: claims it (CARRIER), says WELCOME, and reads
    what the client writes into it."""
    seg = mmap.mmap(memfd, os.fstat(memfd).st_size)
    if struct.unpack_from("<I", seg, 36)[0] == 1:  # OFFERED -> CLAIMED
        struct.pack_into("<I", seg, 36, 2)
    ctl.send(struct.pack("<IBBBBII", 0x4F4C4F43, 2, 1, 0, 0, 0, 0))
    time.sleep(1.5)
    # The bytes written to the client->server ring (its data begins 2048 bytes in: spec/WIRE.md
    # section 4).
    stolen = bytes(seg[2048:]).replace(b"\0", b"")
    print("SEGMENT", len(stolen), repr(stolen[:200]), flush=True)


name = sys.argv[1]
rv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
rv.bind("\0" + name)
rv.listen(64)
socks = [rv]
decoy = None
if len(sys.argv) > 2:
    ip, port = sys.argv[2].rsplit(":", 1)
    decoy = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET)
    decoy.bind((ip.strip("[]"), int(port)))
    decoy.listen(64)
    socks.append(decoy)
print("READY", flush=True)
conns = {}
while True:
    ready, _, _ = select.select(socks + list(conns), [], [], 60)
    if not ready:
        break
    for s in ready:
        if s is rv:
            c, _ = rv.accept()
            conns[c] = "UNIX"
            print("UNIX CONNECTED", flush=True)
        elif s is decoy:
            c, _ = decoy.accept()
            conns[c] = "TCP"
            print("TCP CONNECTED", flush=True)
        else:
            kind = conns[s]
            fds = array.array("i")
            try:
                data, anc, _, _ = s.recvmsg(65536, socket.CMSG_SPACE(16 * fds.itemsize))
            except OSError as e:
                print(kind, "ERROR", e, flush=True)
                data, anc = b"", []
            for level, typ, payload in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
            print(kind, "GOT", len(data), len(fds), repr(data[:64]), flush=True)
            if kind == "UNIX" and len(fds) >= 1:
                steal(s, fds[0])
            if not data and not fds:
                del conns[s]
                s.close()
