#!/usr/bin/python3
"""Run as nobody (inside `unshare -U -r -m`, a user and mount namespace of its own, which any user
may make) by t_rt_fuse_gift.sh: mounts a FUSE file system served by this process (raw
/dev/fuse protocol, no libfuse), opens its one file and passes that descriptor as the segment of
a DIRECT HELLO to the rendezvous of 127.0.0.1:PORT, N times. Every close of a FUSE file sends
FLUSH to its server and waits for the answer, which this one never gives: whichever thread of
the receiver closes the descriptor waits until this process lets go (here: SECONDS, then it
answers every FLUSH and exits). Prints "SENT n" and the answers it got ("ANSWERS ...").
Usage: fuse_gift.py PORT N SECONDS MOUNTPOINT (an empty directory nobody may mount on)"""
import ctypes, os, signal, socket, struct, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca

port, n, secs, mp = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
libc = ctypes.CDLL(None, use_errno=True)
dev = os.open("/dev/fuse", os.O_RDWR)
if libc.mount(b"colo", mp.encode(), b"fuse", 0, b"fd=%d,rootmode=40000,user_id=0,group_id=0" % dev) != 0:
    print("MOUNT FAILED", os.strerror(ctypes.get_errno()), flush=True)
    sys.exit(1)

INIT, LOOKUP, GETATTR, OPEN, FLUSH, RELEASE = 26, 1, 3, 14, 25, 18
flushes, release_flushes = [], threading.Event()


def attr(ino, mode):
    # struct fuse_attr: ino size blocks atime mtime ctime (u64), 3 nsec, mode nlink uid gid
    # rdev blksize flags (u32).
    return struct.pack("<QQQQQQIIIIIIIIII", ino, 4096, 8, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


def reply(unique, body=b"", err=0):
    os.write(dev, struct.pack("<IiQ", 16 + len(body), err, unique) + body)


def serve():
    while True:
        try:
            req = os.read(dev, 1 << 20)
        except OSError:
            return
        length, op, unique, node = struct.unpack_from("<IIQQ", req)
        if op == INIT:
            major, minor = struct.unpack_from("<II", req, 40)
            reply(unique, struct.pack("<IIIIHHIIHHII", 7, min(minor, 31), 0, 0, 0, 0, 4096, 1, 0, 0, 0, 0) + b"\0" * 24)
        elif op == LOOKUP:
            reply(unique, struct.pack("<QQQQII", 2, 0, 0, 0, 0, 0) + attr(2, 0o100644))
        elif op == GETATTR:
            reply(unique, struct.pack("<QII", 0, 0, 0) + attr(node, 0o40755 if node == 1 else 0o100644))
        elif op == OPEN:
            reply(unique, struct.pack("<QII", 1, 0, 0))
        elif op == FLUSH:
            if release_flushes.is_set():
                reply(unique)
            else:
                flushes.append(unique)  # never answered while we hold
        elif op == RELEASE:
            reply(unique)
        else:
            reply(unique, err=-38)  # ENOSYS


threading.Thread(target=serve, daemon=True).start()
f = os.open(mp + "/f", os.O_RDONLY)


def let_go(*_):
    """Answers every FLUSH held and closes the file while this process still serves it: a FUSE
    server that exits holding its own file would wait on its own FLUSH, and so would every
    closer of the receiver's still waiting on one."""
    release_flushes.set()
    for u in list(flushes):
        reply(u)
    os.close(f)
    os._exit(0)


signal.signal(signal.SIGTERM, let_go)
answers, sent = [], 0
for _ in range(n):
    try:
        s = ca.rendezvous(port)
        socket.send_fds(s, [ca.message(ca.HELLO, ca.DIRECT)], [f])
        sent += 1
        answers.append(ca.answer(s, 2.0))
        s.close()
    except OSError as e:
        answers.append("ERR " + e.strerror)
print("SENT", sent, flush=True)
print("ANSWERS", " ".join(sorted(set(answers))), flush=True)
time.sleep(secs)
print("RELEASED", len(flushes), flush=True)
let_go()
