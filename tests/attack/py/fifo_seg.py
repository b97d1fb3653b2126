"""Run as nobody by t_rt_stat_fifo.sh: holds a FIFO open whose /proc/PID/fd link reads
"/memfd:colo-seg", the name `colo stat` looks for. In a user and mount namespace of its own it
mounts a tmpfs, makes the FIFO there and pivots into it: the link of a file on a namespace's root
mount reads from that root, whoever looks. It holds the FIFO with O_PATH (no reader and no writer: a
plain open of it by anyone else waits for one) and sleeps; a thread of it opens the FIFO to
write, which returns only once someone opens it to read (then it prints OPENED).
Usage: fifo_seg.py DIR SECONDS [root] (DIR: a new directory, for the tmpfs). Where user
namespaces are refused it prints NOUSERNS; started by root with "root" it makes only the mount
namespace and then becomes nobody itself (the same FIFO, for hosts without user namespaces).""" 
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
as_root = len(sys.argv) > 3 and sys.argv[3] == "root"
if as_root:
    assert libc.unshare(0x00020000) == 0, ctypes.get_errno()
else:
    if libc.unshare(0x10000000 | 0x00020000) != 0:
        print("NOUSERNS", os.strerror(ctypes.get_errno()), flush=True)
        sys.exit(0)
    open("/proc/self/setgroups", "w").write("deny")
    open("/proc/self/uid_map", "w").write(f"0 {uid} 1")
    open("/proc/self/gid_map", "w").write(f"0 {gid} 1")
def mount(src, dst, fs, flags, data=None):
    if libc.mount(src.encode(), dst.encode(), fs.encode() if fs else None, flags, data) != 0:
        raise OSError(ctypes.get_errno(), "mount " + dst)
MS_REC, MS_PRIVATE = 16384, 1 << 18
mount("none", "/", None, MS_REC | MS_PRIVATE)
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
mount("none", d, "tmpfs", 0)
os.mkdir(d + "/old")
os.mkfifo(d + "/memfd:colo-seg")
# Held without reading it (O_PATH): a writer's open waits for the first reader, and says so
# ("OPENED") if anyone ever opens the FIFO to read it.
fd = os.open(d + "/memfd:colo-seg", os.O_PATH)
fifo = d + "/memfd:colo-seg"
os.chdir(d)
if libc.syscall(155, b".", b"old") != 0:
    raise OSError(ctypes.get_errno(), "pivot_root")
if as_root:
    os.setgroups([])
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)
def writer():
    os.open("/memfd:colo-seg", os.O_WRONLY)  # after the pivot, the FIFO is at the root
    print("OPENED", flush=True)
threading.Thread(target=writer, daemon=True).start()
print("READY", os.getpid(), fd, flush=True)
time.sleep(float(sys.argv[2]))
