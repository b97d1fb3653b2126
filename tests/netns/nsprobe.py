"""The cross-namespace handshake (spec/WIRE.md section 11) spoken by hand, for tests/netns/run.sh.

    nsprobe.py replay HOST PORT DIR
        Proposes on a TCP connection to HOST:PORT, reads ACCEPT, offers a segment with the proof
        over the rendezvous in DIR (expects WELCOME), then offers a second segment with the same
        proof (a replay) and one with a forged server nonce. Prints one line per step:
        `ACCEPT <name>`, `FIRST <answer>`, `REPLAY <answer>`, `FORGED <answer>`.
    nsprobe.py otherboot HOST PORT
        Proposes with another boot id (another host): expects DECLINE, then speaks redis on the
        same connection. Prints `DECLINED <reason>` and the reply to PING (`PONG`).
    nsprobe.py forge DIR
        Without any TCP connection: offers segments with random proofs to every rendezvous in
        DIR. Prints `FORGED <answer> <rendezvous>` per try (an answer waited for up to 3 s),
        `STALE <path>` for a dead server's socket, or `NOCONNECT <errno name>`.
    nsprobe.py flood DIR N SECONDS
        Holds N silent connections to every rendezvous in DIR (reconnecting what the server
        drops) and sends garbage on others, for SECONDS. Prints `FLOOD <connections made>`.
    nsprobe.py stall HOST PORT SECONDS
        A listed peer that makes a server wait: one TCP connection to HOST:PORT that stays
        silent, and one that proposes, reads the answer and never sends the HELLO it asks for.
        Prints `STALL <ACCEPT|DECLINE|NOANSWER>` once both are set up, then holds them.
    nsprobe.py fuseoffer DIR SECONDS
        Root in a mount namespace of its own: mounts a FUSE file system it serves itself, whose
        files answer every request but READ (which never returns), and offers a file of it as
        the segment of a HELLO(CARRIER) flagged NETNS at every rendezvous in DIR: a server that
        reads such a descriptor before checking that it is a memfd hangs in that read. Prints
        `FUSEOFFER <n sent>` and, after SECONDS (or the server's answer), `ANSWER <answer>` and
        `READS <READ requests seen>`.
    nsprobe.py rstserve PORT
        A server on PORT: per connection reads a line; `rst`: answers `ok` and closes with
        SO_LINGER 0 (a reset); `hold`: answers `ok`, then prints how the client ended it
        (`EOF`, `RESET`, `DATA`). Prints `READY` first.
    nsprobe.py rstclient HOST PORT rst|hold
        `rst`: asks the server to reset, prints how the connection ended (`EOF`, `RESET`,
        `DATA`); `hold`: closes with SO_LINGER 0 itself after the answer, prints `SENT`.
    nsprobe.py squat DIR SECONDS
        An attacker who can only read DIR: on every `.live` file there, takes each lock a
        read-only descriptor allows (`flock` exclusive, else shared; an open file description
        read lock; a process read lock) and tries a write lock, then holds them for SECONDS.
        Prints `SQUAT <files> <locks taken>` (`wrlck` among them would be a failure of the mount).
    nsprobe.py hold HOST PORT SECONDS
        A redis client: PING, prints `PONG`, then waits for the server for SECONDS and prints how
        the connection ended: `EOF`, `RESET`, or `OPEN`.
"""
import errno
import fcntl
import os
import socket
import struct
import sys
import time

MAGIC = b"\0COLO-NS"
F_ADD_SEALS, F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW = 1033, 1, 2, 4
FLAG_NETNS = 2


def boot_id():
    with open("/proc/sys/kernel/random/boot_id") as f:
        return bytes.fromhex(f.read().strip().replace("-", ""))


def addr_record(ip, port):
    return struct.pack("<HH", 4, port) + socket.inet_aton(ip) + bytes(12) + bytes(4)


def segment(proof, client, server):
    ring, header = 4096, 1024  # the header's size: spec/WIRE.md section 4
    size = header + 2 * (4096 + ring)
    h = b"COLOSEG\0" + struct.pack("<IIQIIIIII", 1, header, size, ring, 0, 0, 1, os.getpid(), 0)
    h += addr_record(*client) + addr_record(*server)
    h = h.ljust(104, b"\0") + proof
    fd = os.memfd_create("colo-seg", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    os.pwrite(fd, h, 0)
    fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW)
    return fd


def offer(path, proof):
    """Offers a segment with `proof` at the rendezvous `path`; the server's answer."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    memfd = segment(proof, ("10.0.0.1", 40001), ("10.0.0.2", 6379))
    hello = struct.pack("<IBBBxII", 0x4F4C4F43, 1, 1, 2, FLAG_NETNS, 0)
    socket.send_fds(s, [hello], [memfd])
    s.settimeout(3)
    try:
        r = s.recv(64)
    except socket.timeout:
        return "TIMEOUT"
    except OSError:
        return "CLOSED"
    if len(r) != 16:
        return "CLOSED"
    kind, arg = r[4], r[6]
    return {2: "WELCOME", 3: "REJECT(%d)" % arg}.get(kind, "CLOSED")


def rendezvous(d):
    return [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.startswith("colo-") and not n.endswith(".live")]


def replay(host, port, d):
    t = socket.create_connection((host, int(port)), timeout=3)
    cn = os.urandom(8)
    t.sendall(MAGIC + bytes([1, 1]) + bytes(6) + boot_id() + cn)
    a = b""
    while len(a) < 112:
        chunk = t.recv(112 - len(a))
        if not chunk:
            print("NOANSWER")
            return
        a += chunk
    if a[:8] != MAGIC or a[8] != 2:
        print("DECLINED %d" % a[10])
        return
    name = a[48:48 + a[11]].decode()
    print("ACCEPT", name, flush=True)
    proof = cn + a[32:48]
    path = os.path.join(d, name)
    print("FIRST", offer(path, proof), flush=True)
    print("REPLAY", offer(path, proof), flush=True)
    print("FORGED", offer(path, cn + os.urandom(16)), flush=True)
    t.close()


def otherboot(host, port):
    t = socket.create_connection((host, int(port)), timeout=3)
    boot = bytes(b ^ 0xFF for b in boot_id())
    t.sendall(MAGIC + bytes([1, 1]) + bytes(6) + boot + os.urandom(8))
    a = b""
    while len(a) < 112:
        chunk = t.recv(112 - len(a))
        if not chunk:
            print("NOANSWER")
            return
        a += chunk
    print("DECLINED %d" % a[10] if a[:8] == MAGIC and a[8] == 3 else "ANSWER %d" % a[8], flush=True)
    t.sendall(b"PING\r\n")
    print(t.recv(64).decode().strip().lstrip("+"), flush=True)


def forge(d):
    for path in rendezvous(d):
        for _ in range(3):
            try:
                print("FORGED", offer(path, os.urandom(24)), os.path.basename(path), flush=True)
            except ConnectionRefusedError:
                print("STALE", path, flush=True)  # a killed server's leftover socket file
                break
            except OSError as e:
                print("NOCONNECT", errno.errorcode.get(e.errno, e.errno), flush=True)
                break


def flood(d, n, seconds):
    held, made = [], 0
    end = time.time() + float(seconds)
    while time.time() < end:
        for path in rendezvous(d):
            while len(held) < int(n):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.setblocking(False)
                try:
                    s.connect(path)
                except OSError:
                    s.close()
                    break
                made += 1
                if made % 4 == 0:
                    try:
                        s.send(b"garbage, not a HELLO")
                    except OSError:
                        pass
                held.append(s)
        # Drop what the server closed; keep the rest.
        alive = []
        for s in held:
            try:
                if s.recv(64, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b"":
                    s.close()
                    continue
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                continue
            alive.append(s)
        held = alive
        time.sleep(0.01)
    print("FLOOD", made, flush=True)


def stall(host, port, seconds):
    silent = socket.create_connection((host, int(port)), timeout=30)
    t = socket.create_connection((host, int(port)), timeout=30)
    t.sendall(MAGIC + bytes([1, 1]) + bytes(6) + boot_id() + os.urandom(8))
    a = b""
    while len(a) < 112:
        chunk = t.recv(112 - len(a))
        if not chunk:
            break
        a += chunk
    kind = {2: "ACCEPT", 3: "DECLINE"}.get(a[8], "NOANSWER") if len(a) == 112 and a[:8] == MAGIC else "NOANSWER"
    print("STALL", kind, flush=True)
    time.sleep(float(seconds))
    silent.close()
    t.close()


def silent(host, port, n, seconds):
    """Opens n TCP connections that never send a byte, holds them `seconds`."""
    conns = [socket.create_connection((host, int(port)), timeout=30) for _ in range(int(n))]
    print("SILENT", len(conns), flush=True)
    time.sleep(float(seconds))
    for c in conns:
        c.close()


def fuse_serve(dev, reads):
    """A FUSE server for one file (node 2, 1 MiB): answers INIT, LOOKUP, GETATTR, OPEN, FLUSH and
    RELEASE; never READ (counted in reads[0]); ENOSYS for the rest."""
    def attr(node):
        mode = 0o40755 if node == 1 else 0o100644
        return struct.pack("<QQQQQQIIIIIIIIII", node, 1 << 20, 2048, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)
    while True:
        try:
            req = os.read(dev, 1 << 20 | 4096)
        except OSError:
            return  # unmounted or aborted
        _, op, unique, node = struct.unpack_from("<IIQQ", req)
        body, err = b"", 0
        if op == 26:  # INIT
            body = struct.pack("<IIIIHHIIHHI7I", 7, 31, 0, 0, 16, 12, 1 << 17, 1, 32, 0, 0, *[0] * 7)
        elif op == 1:  # LOOKUP
            body = struct.pack("<QQQQII", 2, 0, 3600, 3600, 0, 0) + attr(2)
        elif op == 3:  # GETATTR
            body = struct.pack("<QII", 3600, 0, 0) + attr(node)
        elif op == 14:  # OPEN
            body = struct.pack("<QII", 1, 0, 0)
        elif op in (25, 18):  # FLUSH, RELEASE
            pass
        elif op == 15:  # READ: never answered
            reads[0] += 1
            continue
        else:
            err = -errno.ENOSYS
        try:
            os.write(dev, struct.pack("<IiQ", 16 + len(body), err, unique) + body)
        except OSError:
            pass


def fuseoffer(d, seconds):
    import ctypes
    import tempfile
    import threading
    libc = ctypes.CDLL(None, use_errno=True)
    mnt = tempfile.mkdtemp(prefix="colo-fuse-")
    dev = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    opts = ("fd=%d,rootmode=40000,user_id=0,group_id=0" % dev).encode()
    if libc.mount(b"colofuse", mnt.encode(), b"fuse", 6, opts) != 0:  # MS_NOSUID | MS_NODEV
        print("NOMOUNT", errno.errorcode.get(ctypes.get_errno()), flush=True)
        return
    reads = [0]
    threading.Thread(target=fuse_serve, args=(dev, reads), daemon=True).start()
    sent = []
    for path in rendezvous(d):
        f = os.open(os.path.join(mnt, "seg"), os.O_RDONLY | os.O_CLOEXEC)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(path)
        except OSError:
            s.close()
            continue
        hello = struct.pack("<IBBBxII", 0x4F4C4F43, 1, 1, 2, FLAG_NETNS, 0)
        socket.send_fds(s, [hello], [f])
        sent.append(s)
    print("FUSEOFFER", len(sent), flush=True)
    answers = []
    end = time.time() + float(seconds)
    for s in sent:
        s.settimeout(max(0.1, end - time.time()))
        try:
            r = s.recv(64)
            answers.append({2: "WELCOME", 3: "REJECT(%d)" % r[6]}.get(r[4], "CLOSED") if len(r) == 16 else "CLOSED")
        except socket.timeout:
            answers.append("TIMEOUT")
        except OSError:
            answers.append("CLOSED")
    print("ANSWER", " ".join(answers), flush=True)
    print("READS", reads[0], flush=True)
    os.close(dev)  # aborts the connection: a read still waiting fails (ENOTCONN)
    libc.umount2(mnt.encode(), 2)  # MNT_DETACH
    os.rmdir(mnt)


LINGER0 = struct.pack("ii", 1, 0)


def ending(s):
    try:
        r = s.recv(64)
        return "EOF" if r == b"" else "DATA"
    except ConnectionResetError:
        return "RESET"


def rstserve(port):
    import signal
    signal.alarm(300)  # watchdog
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", int(port)))
    ls.listen()
    print("READY", flush=True)
    while True:
        c, _ = ls.accept()
        c.settimeout(20)
        line = b""
        while not line.endswith(b"\n"):
            b = c.recv(64)
            if not b:
                break
            line += b
        c.sendall(b"ok\n")
        if line == b"rst\n":
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER0)
        else:
            print(ending(c), flush=True)
        c.close()


def rstclient(host, port, mode):
    s = socket.create_connection((host, int(port)), timeout=20)
    s.sendall(mode.encode() + b"\n")
    got = b""
    while len(got) < 3:
        b = s.recv(3 - len(got))
        if not b:
            break
        got += b
    if got != b"ok\n":
        print("NOANSWER", got, flush=True)
        return
    if mode == "rst":
        print(ending(s), flush=True)
    else:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER0)
        s.close()
        print("SENT", flush=True)


def squat(d, seconds):
    held, taken = [], set()
    rd = struct.pack("@hhqqi4x", fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0)
    wr = struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    lives = [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".live")]
    for path in lives:
        fds = [os.open(path, os.O_RDONLY) for _ in range(3)]
        held += fds
        for op, name in ((fcntl.LOCK_EX, "flock-ex"), (fcntl.LOCK_SH, "flock-sh")):
            try:
                fcntl.flock(fds[0], op | fcntl.LOCK_NB)
                taken.add(name)
                break
            except OSError:
                pass
        for fd, cmd, arg, name in ((fds[1], fcntl.F_OFD_SETLK, rd, "ofd-rdlck"), (fds[2], fcntl.F_SETLK, rd, "rdlck"),
                                   (fds[1], fcntl.F_OFD_SETLK, wr, "wrlck")):
            try:
                fcntl.fcntl(fd, cmd, arg)
                taken.add(name)
            except OSError:
                pass
    print("SQUAT", len(lives), ",".join(sorted(taken)) or "none", flush=True)
    time.sleep(float(seconds))


def hold(host, port, seconds):
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(b"PING\r\n")
    print(s.recv(64).decode().strip().lstrip("+"), flush=True)
    s.settimeout(float(seconds))
    try:
        r = s.recv(64)
        print("EOF" if r == b"" else "DATA", flush=True)
    except socket.timeout:
        print("OPEN", flush=True)
    except ConnectionResetError:
        print("RESET", flush=True)


if __name__ == "__main__":
    {"replay": replay, "otherboot": otherboot, "forge": forge, "flood": flood, "squat": squat, "stall": stall, "silent": silent, "fuseoffer": fuseoffer, "rstserve": rstserve, "rstclient": rstclient, "hold": hold}[sys.argv[1]](*sys.argv[2:])
