"""A forged CARRIER offer (issue 21: claim() verifies who sent the offer), for t_forged_offer.sh.

    forge_offer.py victim NAME PORT PAYLOAD EXPECT
        Run as root: binds a plain TCP client socket on 127.0.0.1 (an odd port: bind(0) picks
        odd ports first), starts `forge_offer.py forge ...` as nobody with that socket's 4-tuple,
        waits until the forged offer is sent, then connects to 127.0.0.1:PORT, sends PAYLOAD and
        reads the reply. Prints `VICTIM GOT <reply>` (or `VICTIM NOTHING <error>`) and the
        forger's lines.
    forge_offer.py forge NAME CLIENT_PORT SERVER_PORT
        Run as nobody: sends HELLO(CARRIER) to the rendezvous NAME with a valid sealed segment
        whose header names the 4-tuple 127.0.0.1:CLIENT_PORT -> 127.0.0.1:SERVER_PORT (which
        anyone can read in /proc/net/tcp), prints SENT, then the answer: `WELCOME` (the server
        claimed the offer: the victim's connection now reads and writes the forger's segment),
        `REJECT <reason>` or `CLOSED`.
"""
import array
import fcntl
import os
import socket
import struct
import subprocess
import sys
import time


def addr(port):
    return struct.pack("<HH4s", 4, port, socket.inet_aton("127.0.0.1")).ljust(24, b"\0")


def forge(name, cport, sport):
    header = 1024  # the segment header (spec/WIRE.md section 4)
    cap, size = 4096, header + 2 * 8192  # no pool: each block is 4096 (queues) + the ring
    fd = os.memfd_create("colo-seg", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    head = b"COLOSEG\0" + struct.pack("<IIQIIIIII", 1, header, size, cap, 0, 0, 1, os.getpid(), 0)
    os.pwrite(fd, head + addr(cport) + addr(sport), 0)
    for base in (header, header + 8192):  # both rings start at 2048 bytes (spec/WIRE.md section 5)
        os.pwrite(fd, struct.pack("<I", 2048), base + 12)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect("\0" + name)
    hello = struct.pack("<IBBBBII", 0x4F4C4F43, 1, 1, 2, 0, 0, 0)
    s.sendmsg([hello], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    print("SENT", flush=True)
    s.settimeout(8)
    try:
        m = s.recv(64)
    except OSError as e:
        print("CLOSED", e, flush=True)
        return
    if len(m) == 16 and m[4] == 2:
        print("WELCOME", flush=True)
    elif len(m) == 16 and m[4] == 3:
        print("REJECT", m[6], flush=True)
    else:
        print("CLOSED", len(m), flush=True)


def victim(name, port, payload, expect):
    c = socket.socket()
    c.bind(("127.0.0.1", 0))
    cport = c.getsockname()[1]
    here = os.path.abspath(__file__)
    f = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, here, "forge", name, str(cport), str(port)],
        stdout=subprocess.PIPE, text=True)
    line = f.stdout.readline().strip()
    print("FORGER", line, flush=True)
    c.settimeout(5)
    c.connect(("127.0.0.1", port))
    c.sendall(payload.encode())
    got = b""
    try:
        while expect.encode() not in got:
            d = c.recv(4096)
            if not d:
                break
            got += d
        print("VICTIM GOT", repr(got), flush=True)
    except OSError as e:
        print("VICTIM NOTHING", e, repr(got), flush=True)
    for line in f.communicate(timeout=15)[0].splitlines():
        print("FORGER", line, flush=True)
    c.close()


if sys.argv[1] == "forge":
    forge(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
else:
    victim(sys.argv[2], int(sys.argv[3]), sys.argv[4].encode().decode("unicode_escape"), sys.argv[5])
