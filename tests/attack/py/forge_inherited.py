# The attacker of t_rt_inherited_memfds.sh: a program exec'd without the shim under another uid
# (nobody) that inherited root's colo memfds. KIND handover FD: appends to `colo-handover` a
# record naming descriptors 0, 1, 2 and FD with a socket inode nobody has (the next image's shim
# took them and closed them). KIND nofile: writes 5 into `colo-nofile` (the hard limit the next
# image reports). KIND holders: fills page 0 of `colo-holders` (the bitmap of the holders pages,
# whose pages hold each connection's holders, writers' turn and socket flags) with ones. Through
# the inherited descriptor, else by opening it again through /proc.
# Prints FORGED or REFUSED for each file found.
import os, struct, sys

kind = sys.argv[1]
name = {'handover': '/memfd:colo-handover', 'nofile': '/memfd:colo-nofile', 'holders': '/memfd:colo-holders'}[kind]
found = False
for fd in os.listdir('/proc/self/fd'):
    try:
        link = os.readlink(f'/proc/self/fd/{fd}')
    except OSError:
        continue
    if not link.startswith(name):
        continue
    found = True
    f = int(fd)
    if kind == 'handover':
        data = os.pread(f, 1 << 16, 0)
        at = next((i for i in range(0, len(data), 32) if data[i:i + 32] == bytes(32)), len(data))
        what = struct.pack('<Q4iB7x', 0xdead_beef, 0, 1, 2, int(sys.argv[2]), 2)
    elif kind == 'holders':
        at, what = 0, b'\xff' * 4096
    else:
        at, what = 0, struct.pack('<Q', 5)
    errors = []
    for how in ('inherited', 'reopened'):
        try:
            w = f if how == 'inherited' else os.open(f'/proc/self/fd/{f}', os.O_RDWR)
            os.pwrite(w, what, at)
            print('FORGED', kind, how, flush=True)
            break
        except OSError as e:
            errors.append(f'{how}: {e.strerror}')
    else:
        print('REFUSED', kind, '; '.join(errors), flush=True)
if not found:
    print('NOFILE', kind, 'no', name, 'inherited', flush=True)
