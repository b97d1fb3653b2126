#!/usr/bin/python3
"""Run as nobody by t_rt_peer_memfd_name.sh: a CARRIER client whose segment memfd is named
`colo-nofile`; once welcomed it writes VALUE over the header's first 8 bytes (the magic, which
the server read only when it attached), which an image root execs with the connection
inherited reads as the application's hard limit of open files (record::app_nofile::inherit).
Usage: memfd_name_nofile.py PORT VALUE"""
import os, socket, struct, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doorbell_attacker as da
port, value = int(sys.argv[1]), int(sys.argv[2])
real = os.memfd_create
orig = da.segment
def segment(*a):
    os.memfd_create = lambda _n, f: real("colo-nofile", f)
    try: return orig(*a)
    finally: os.memfd_create = real
da.segment = segment
c = da.Conn(port, da.CARRIER, "control")
a = da.answer(c.ctl)
c.m[0:8] = struct.pack("<Q", value)   # the header's magic, read by the server only at attach
c.tcp.settimeout(3)
try: print(a, c.tcp.recv(100))
except Exception as e: print(a, e)
