"""Run by root under colo run for t_rt_exec_setuid.sh: an inetd-like server on 127.0.0.1:PORT
that runs its service as another user. It accepts one connection with libc's accept (no
SOCK_CLOEXEC: the descriptor is born inheritable, as a C server's), forks; the child drops to
nobody:nogroup (setgroups, setgid, setuid: what inetd does for a service whose user is nobody)
and execs PROGRAM with the connection's descriptor number as its last argument; the parent
closes its copy and waits for the child.
With DUMPABLE=1 in its environment, the child makes itself dumpable again after the setuid, as
nginx does with its workers (for core dumps): the relay it forks before the exec must not be.
With EXEC=execveat or EXEC=syscall, the child execs through libc's execveat or a raw
syscall(SYS_execve) instead of execv.
Usage: exec_nobody_server.py PORT PROGRAM ARG..."""
import ctypes
import os
import socket
import sys

port, program, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
libc = ctypes.CDLL(None, use_errno=True)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(8)
print("LISTENING", flush=True)
fd = libc.accept(s.fileno(), None, None)
if fd < 0:
    print("accept failed: errno %d" % ctypes.get_errno(), flush=True)
    sys.exit(1)
pid = os.fork()
if pid == 0:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    if os.environ.get("DUMPABLE") == "1":
        libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
    argv = [program] + args + [str(fd)]
    how = os.environ.get("EXEC", "execv")
    if how != "execv":
        c_argv = (ctypes.c_char_p * (len(argv) + 1))(*[a.encode() for a in argv], None)
        env = [("%s=%s" % kv).encode() for kv in os.environ.items()]
        c_env = (ctypes.c_char_p * (len(env) + 1))(*env, None)
        if how == "execveat":
            libc.execveat(-100, program.encode(), c_argv, c_env, 0)  # AT_FDCWD
        else:
            libc.syscall(59, program.encode(), c_argv, c_env)  # SYS_execve
        os._exit(127)
    os.execv(program, argv)
os.close(fd)
_, status = os.waitpid(pid, 0)
print("SERVICE EXITED %d" % os.waitstatus_to_exitcode(status), flush=True)
