"""Run as nobody by t_rt_netns_chmod.sh: in a directory it may write (COLO_NETNS_DIR of root's
server), waits (inotify) for each rendezvous socket `colo-<pid>-<port>` a server binds there and,
at once, renames it away and puts a symbolic link to TARGET under its name: a server that then
sets the socket's mode through the name (chmod follows links) sets TARGET's.
Usage: netns_swap.py DIR TARGET SECONDS. Prints "READY", then "SWAPPED <name>" per swap."""
import ctypes
import os
import re
import struct
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
d, target, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
IN_CREATE = 0x100
fd = libc.inotify_init1(0)
if fd < 0 or libc.inotify_add_watch(fd, d.encode(), IN_CREATE) < 0:
    print("NOINOTIFY", os.strerror(ctypes.get_errno()), flush=True)
    sys.exit(1)
sock = re.compile(r"^colo-\d+-\d+$")
ours = set()  # the links we made: their own IN_CREATE is not a server's bind
print("READY", flush=True)
end = time.time() + secs
while time.time() < end:
    buf = os.read(fd, 65536)
    i = 0
    while i < len(buf):
        _, _, _, n = struct.unpack_from("iIII", buf, i)
        name = buf[i + 16:i + 16 + n].rstrip(b"\0").decode()
        i += 16 + n
        if name in ours:
            ours.discard(name)
        elif sock.match(name):
            try:
                os.rename(os.path.join(d, name), os.path.join(d, name + ".moved"))
                ours.add(name)
                os.symlink(target, os.path.join(d, name))
                print("SWAPPED", name, flush=True)
            except OSError as e:
                print("MISSED", name, e, flush=True)
