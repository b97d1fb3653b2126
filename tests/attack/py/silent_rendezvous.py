"""Run as nobody by t_rt_go_silent.sh: holds N rendezvous connections to colo/1/127.0.0.1:PORT
that never say anything, each replaced by a fresh one every 4 s (before the listener's 5 s
timeout drops it), for SECONDS.
Usage: silent_rendezvous.py PORT N SECONDS"""
import socket
import sys
import time

port, n, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
end = time.time() + secs
held = []
while time.time() < end:
    new = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(b"\0colo/1/127.0.0.1:%d" % port)
        new.append(s)
    for s in held:
        s.close()
    held = new
    print("HELD", len(held), flush=True)
    time.sleep(min(4, max(0, end - time.time())))
