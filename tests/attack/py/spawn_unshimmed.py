# Root's program of t_rt_inherited_memfds.sh, under colo run: it holds what the shim hands on
# across exec in inheritable memfds (an accelerated inheritable connection to redis on PORT: the
# `colo-handover` file and its holders page in `colo-holders`; a hard limit of open files it
# lowered: `colo-nofile`), then starts two
# children with posix_spawn, which runs no fork handler of the shim's: first the attacker as
# nobody without the shim (setpriv, LD_PRELOAD left out of its environment), then a shell under
# the shim that prints its hard limit to a pipe and its descriptors to stderr. Prints what the
# shell said and whether its own connection still answers.
import os, resource, socket, sys

port, attacker = int(sys.argv[1]), sys.argv[2]
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
s = socket.create_connection(('127.0.0.1', port))
s.set_inheritable(True)
s.sendall(b'PING\r\n')
assert s.recv(7) == b'+PONG\r\n'
env = {'PATH': '/usr/bin:/bin'}
for kind in ('handover', 'nofile', 'holders'):
    pid = os.posix_spawn('/usr/bin/setpriv', ['setpriv', '--reuid=nobody', '--regid=nogroup', '--clear-groups',
                         '/usr/bin/python3', attacker, kind, str(s.fileno())], env)
    os.waitpid(pid, 0)
r, w = os.pipe()
pid = os.posix_spawn('/bin/sh', ['sh', '-c', 'echo "hard limit $(ulimit -Hn)"'], dict(os.environ),
                     file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])
os.close(w)
os.waitpid(pid, 0)
print('CHILD', os.read(r, 200).decode().strip() or 'said nothing', flush=True)
s.sendall(b'PING\r\n')
print('PARENT', s.recv(7).decode().strip(), flush=True)
