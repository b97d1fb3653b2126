"""Run as nobody by t_rt_v6only_squat.sh: listens on TCP [::]:PORT with IPV6_V6ONLY (which takes
no IPv4 connection: a TCP client of 127.0.0.1:PORT is refused) and binds its rendezvous
colo/1/[::]:PORT, the name an IPv4 client's lookup tries last. It answers every HELLO with
WELCOME and prints what reaches it: "CONNECTED" for a client that hangs up without a word,
"HELLO <mode> <descriptors>", then "GOT <bytes>" for the
bytes a client writes into the segment's client-to-server ring. Prints "READY" first.
With DEVICE, the listener is instead 0.0.0.0:PORT bound to DEVICE (SO_BINDTODEVICE, which an
unprivileged user may set), with the name colo/1/0.0.0.0:PORT: it takes no connection that
comes in on loopback.
Usage: v6only_squatter.py PORT SECONDS [DEVICE]"""
import mmap
import os
import select
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import colo_attack as ca  # noqa: E402

port, secs = int(sys.argv[1]), float(sys.argv[2])
device = sys.argv[3] if len(sys.argv) > 3 else None
if device:
    # The IPv4 wildcard, bound to a device a loopback connection never comes in on.
    tcp = socket.socket()
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
    tcp.bind(("0.0.0.0", port))
    name = b"\0colo/1/0.0.0.0:%d" % port
else:
    tcp = socket.socket(socket.AF_INET6)
    tcp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    tcp.bind(("::", port))
    name = b"\0colo/1/[::]:%d" % port
tcp.listen(8)
rv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
rv.bind(name)
rv.listen(8)
print("READY", flush=True)
end = time.time() + secs
maps = []
while time.time() < end:
    r, _, _ = select.select([rv], [], [], 0.05)
    if r:
        c, _ = rv.accept()
        msg, fds, _, _ = socket.recv_fds(c, 64, 4)
        if not msg and not fds:
            print("CONNECTED", flush=True)  # and hung up without a word: all a client may do
            c.close()
            continue
        mode = msg[6] if len(msg) == 16 else -1
        print("HELLO", mode, len(fds), flush=True)
        if fds:
            size = os.fstat(fds[0]).st_size
            m = mmap.mmap(fds[0], size)
            struct.pack_into("<I", m, 36, 2)  # claim: CLAIMED (CARRIER) - harmless for DIRECT
            c.send(ca.message(ca.WELCOME))
            maps.append([c, m, 0])
    for e in maps:
        c, m, seen = e
        ring = struct.unpack_from("<I", m, 24)[0]
        slots = struct.unpack_from("<I", m, 32)[0]
        data_off = (768 + 12 * slots + 1023) // 1024 * 1024
        size = struct.unpack_from("<I", m, 4096 + 12)[0] or ring  # the ring's current size
        head = struct.unpack_from("<Q", m, 4096)[0]
        if head != seen:
            n = min(head - seen, 256)
            got = bytes(m[4096 + data_off + (seen + i) % size] for i in range(n))
            print("GOT", repr(got), flush=True)
            e[2] = head
            struct.pack_into("<Q", m, 4096 + 128, head)
print("DONE", flush=True)
