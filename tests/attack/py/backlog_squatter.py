#!/usr/bin/python3
"""Run as nobody by t_rt_squat_backlog.sh: binds the abstract rendezvous name NAME (without the
leading NUL) with a SOCK_SEQPACKET listener that never accepts, fills its backlog with
connections of its own, and holds it all for SECONDS. A client's blocking connect(2) to that
name then waits for room, which never comes. Prints "READY <queued>".
Usage: backlog_squatter.py NAME SECONDS"""
import socket, sys, time
name, secs = sys.argv[1].encode(), float(sys.argv[2])
l = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
l.bind(b"\0" + name)
l.listen(0)
keep = []
while True:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.setblocking(False)
    try:
        s.connect(b"\0" + name)
    except BlockingIOError:
        break
    keep.append(s)
print("READY", len(keep), flush=True)
time.sleep(secs)
