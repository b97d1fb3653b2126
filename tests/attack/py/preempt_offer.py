"""Run as nobody by t_rt_offer_preempt.sh: offers a CARRIER segment (spec/WIRE.md sections 3-4,
socket-pair doorbells, sealed memfd) for the 4-tuple 127.0.0.1:SRC -> 127.0.0.1:PORT, a
connection another user is about to make, and waits up to SECONDS for the server's answer.
Prints "READY" once the offer is sent, then "ANSWER WELCOME", "ANSWER REJECT(<reason>)",
"ANSWER CLOSED" or "ANSWER NONE".
Usage: preempt_offer.py PORT SRC SECONDS"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402

port, src, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
fd = ca.make_segment(4096, 0, 0, ca.CLAIM_OFFERED, ("127.0.0.1", src), ("127.0.0.1", port))
bells = ca.doorbells()
s = ca.rendezvous(port)
ca.hello(s, ca.CARRIER, fd, bells)
print("READY", flush=True)
a = ca.answer(s, secs)
print("ANSWER", "NONE" if a == "TIMEOUT" else a, flush=True)
