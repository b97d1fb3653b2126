"""Run as nobody by t_rt_stat_names.sh: puts bytes of its choosing where root's `colo stat`
reads names. Its program name (PR_SET_NAME) and a listening socket named colo/1/... carry
terminal escape sequences; another abstract socket's name has a byte that is not UTF-8 (it
shows in /proc/net/unix); and of its two CARRIER connections to root's server at 127.0.0.1:PORT
the second's segment memfd is named `colo-seg\\xff`, which root's server's /proc/PID/maps then
shows. Prints READY, then holds everything for SECONDS. Usage: stat_names.py PORT SECONDS"""
import ctypes
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doorbell_attacker as da  # noqa: E402

port, secs = int(sys.argv[1]), float(sys.argv[2])
ctypes.CDLL(None).prctl(15, b"\x1b[31mEVIL\x1b[0m", 0, 0, 0)  # PR_SET_NAME
esc = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
esc.bind(b"\0colo/1/\x1b[2J\x1b[H\x1b]0;owned\x07127.0.0.1:22")
esc.listen(1)
bad = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
bad.bind(b"\0stat-names\xff")
conns = []
real = os.memfd_create
for name in ("colo-seg", "colo-seg\udcff"):  # surrogateescape: the byte 0xff
    os.memfd_create = lambda _n, flags=0, name=name: real(name, flags)
    c = da.Conn(port, da.CARRIER, "control")
    a = da.answer(c.ctl)
    print("answer", a, flush=True)
    conns.append(c)
os.memfd_create = real
print("READY", flush=True)
time.sleep(secs)
