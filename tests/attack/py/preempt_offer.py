"""Run as nobody by t_rt_offer_preempt.sh: offers a CARRIER segment (spec/WIRE.md sections 3-4,
socket-pair doorbells, sealed memfd) for the 4-tuple 127.0.0.1:SRC -> 127.0.0.1:PORT, a
connection another user is about to make, and waits up to SECONDS for the server's answer.
With "after", it first waits (up to SECONDS) until that connection shows in /proc/net/tcp
(established, waiting in the server's backlog), and offers then: after the real client's offer.
Prints "READY" once the offer is sent, then "ANSWER WELCOME", "ANSWER REJECT(<reason>)",
"ANSWER CLOSED" or "ANSWER NONE".
Usage: preempt_offer.py PORT SRC SECONDS [after]"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402

port, src, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])


def established():
    want = ("0100007F:%04X" % src, "0100007F:%04X" % port)
    with open("/proc/net/tcp") as f:
        return any(tuple(l.split()[1:3]) == want and l.split()[3] == "01" for l in f.readlines()[1:])


if len(sys.argv) > 4 and sys.argv[4] == "after":
    print("WATCHING", flush=True)
    end = time.time() + secs
    while not established() and time.time() < end:
        time.sleep(0.001)
fd = ca.make_segment(4096, 0, 0, ca.CLAIM_OFFERED, ("127.0.0.1", src), ("127.0.0.1", port))
bells = ca.doorbells()
s = ca.rendezvous(port)
ca.hello(s, ca.CARRIER, fd, bells)
print("READY", flush=True)
a = ca.answer(s, secs)
print("ANSWER", "NONE" if a == "TIMEOUT" else a, flush=True)
