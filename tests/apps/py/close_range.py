"""A connection closed by close_range(2) (os.closerange) under colo run: the shim lets go of it as
it does on close, so the peer sees its end of file and the server keeps no descriptor of it.
Exits 0 on success; run with COLO_LOG=info, the caller checks the connection was accelerated."""
import os, socket, sys, time

signal_alarm = __import__("signal").alarm
signal_alarm(20)
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(8)
port = l.getsockname()[1]
pid = os.fork()
if pid == 0:
    c = socket.create_connection(("127.0.0.1", port))
    c.settimeout(10)
    c.sendall(b"hi")
    try:
        got = c.recv(10)
    except OSError as e:
        got = repr(e).encode()
    os._exit(0 if got == b"" else 1)
c, _ = l.accept()
c.recv(2)
before = len(os.listdir("/proc/self/fd"))
fd = c.detach()
os.closerange(fd, fd + 1)
# What the connection held is closed at once or by a background thread a moment later.
for _ in range(100):
    after = len(os.listdir("/proc/self/fd"))
    if after <= before - 1:
        break
    time.sleep(0.05)
_, status = os.waitpid(pid, 0)
ok = after <= before - 1 and status == 0
print(f"descriptors {before} -> {after}; the client saw {'its' if status == 0 else 'no'} end of file")
sys.exit(0 if ok else 1)
