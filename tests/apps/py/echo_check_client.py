"""Sends MIB MiB of a known pattern to 127.0.0.1:PORT while reading the echo, then prints OK if
every byte came back in order (else BAD and the count).
Usage: echo_check_client.py PORT MIB"""
import socket
import sys
import threading

s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
data = bytes((i * 7) % 251 for i in range(int(sys.argv[2]) << 20))


def send():
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)


t = threading.Thread(target=send)
t.start()
got = bytearray()
while True:
    b = s.recv(1 << 16)
    if not b:
        break
    got += b
t.join()
print("OK" if bytes(got) == data else "BAD %d" % len(got))
