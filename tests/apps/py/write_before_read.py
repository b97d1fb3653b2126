"""Write before read: a client that sends all of a request before reading any of the answer.

server PORT: an echo server on 127.0.0.1:PORT (a thread per connection: reads up to 64 KiB,
  writes it all back, blocking, until end of file, then ends its side); prints "ready".
client PORT MIB STALL: connects, writes MIB MiB (seeded pseudo-random bytes) and ends its side,
  then reads until end of file and checks every byte. No operation may go STALL seconds without
  progress (a socket timeout, the watchdog for a connection that can no longer move: the echo
  fills what the path buffers from the server back to the client, the server stops reading,
  then the client's writes fill the path forward). Exits 0 and prints "OK MIB" when all came
  back intact, 2 on a stall, 1 on wrong bytes.
"""
import random
import socket
import sys
import threading


def serve(port):
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", port))
    lst.listen(16)
    print("ready", flush=True)

    def echo(c):
        with c:
            while True:
                b = c.recv(65536)
                if not b:
                    break
                c.sendall(b)
            c.shutdown(socket.SHUT_WR)

    while True:
        c, _ = lst.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()


def client(port, mib, stall):
    data = random.Random(mib).randbytes(mib << 20)
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(stall)
    view, sent = memoryview(data), 0
    try:
        while sent < len(data):
            sent += s.send(view[sent : sent + (1 << 20)])
        s.shutdown(socket.SHUT_WR)
    except socket.timeout:
        print(f"STALL writing: {sent} of {len(data)} bytes sent, none read", flush=True)
        return 2
    got = bytearray()
    try:
        while True:
            b = s.recv(1 << 20)
            if not b:
                break
            got += b
    except socket.timeout:
        print(f"STALL reading: {len(got)} of {len(data)} bytes back", flush=True)
        return 2
    if got != data:
        at = next((i for i, (x, y) in enumerate(zip(got, data)) if x != y), min(len(got), len(data)))
        print(f"WRONG: {len(got)} bytes back of {len(data)}, first difference at {at}", flush=True)
        return 1
    print(f"OK {mib}", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(int(sys.argv[2]))
    else:
        sys.exit(client(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
