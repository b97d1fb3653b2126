"""A listener on 127.0.0.1:PORT with SO_REUSEPORT for tests/attack/t_rt_ask.sh: `accept` takes
every connection and holds it; `hold` never accepts. Prints READY once listening."""
import socket
import sys
import time

port, how = int(sys.argv[1]), sys.argv[2]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind(("127.0.0.1", port))
s.listen(64)
print("READY", flush=True)
held = []
while True:
    if how == "accept":
        held.append(s.accept()[0])
    else:
        time.sleep(1)
