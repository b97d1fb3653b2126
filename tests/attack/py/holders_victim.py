"""Root's program for t_rt_holders_dumpable.sh (run under colo run): a colo connection to root's
echo server, then a fork child that closes its copy, drops to nobody and makes itself dumpable
again (as a server's worker does for core dumps: by the raw system call through libc's
syscall(), then by prctl()), holding no connection. The parent keeps its
connection and, once the file GO exists, makes ROUNDS echo round trips.

    holders_victim.py PORT GO ROUNDS
Prints CHILD pid dumpable=0|-1 errno raw=0|-1 errno (prctl, then syscall), READY, then DONE n once the round trips are made.
"""
import ctypes
import os
import socket
import sys
import time

port, go, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port))


def round_trip(msg):
    s.sendall(msg)
    got = b""
    while len(got) < len(msg):
        b = s.recv(len(msg) - len(got))
        if not b:
            raise SystemExit("EOF")
        got += b
    assert got == msg


round_trip(b"before")
r, w = os.pipe()
life_r, life_w = os.pipe()  # the child ends when the parent does (end of file)
child = os.fork()
if child == 0:
    os.close(r)
    s.close()
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    libc = ctypes.CDLL(None, use_errno=True)
    # The raw system call through libc's syscall() first (SYS_prctl), then libc's prctl().
    sys_prctl = {"x86_64": 157, "aarch64": 167}[os.uname().machine]
    raw = libc.syscall(sys_prctl, 4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
    raw_errno = ctypes.get_errno()
    rc = libc.prctl(4, 1, 0, 0, 0)
    os.write(w, b"%d %d raw=%d %d" % (rc, ctypes.get_errno(), raw, raw_errno))
    os.close(w)
    os.close(life_w)
    os.read(life_r, 1)
    os._exit(0)
os.close(w)
os.close(life_r)
rc = os.read(r, 64).decode()
print("CHILD", child, "dumpable=" + rc, flush=True)
print("READY", flush=True)
while not os.path.exists(go):
    time.sleep(0.05)
for i in range(rounds):
    round_trip(b"round %d" % i)
print("DONE", rounds, flush=True)
os.kill(child, 9)
