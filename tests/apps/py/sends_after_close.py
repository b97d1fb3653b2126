"""A client that, once its server answered and closed the connection, writes to it three times
and prints what each write did: over TCP the first is taken (the peer's kernel answers it with
RST) and the next ones fail with EPIPE. For tests/apps/passed.sh. usage: sends_after_close.py PORT"""
import signal, socket, sys, time
signal.alarm(10)
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"hello\n")
print(s.recv(100).decode().strip())
print("end of stream" if s.recv(100) == b"" else "more bytes")
out = []
for _ in range(3):
    try:
        s.send(b"x")
        out.append("sent")
    except OSError as e:
        out.append(e.__class__.__name__)
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0.2)
print(" ".join(out))
