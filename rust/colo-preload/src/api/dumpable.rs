//! `prctl(2)`, and the gate it shares with `syscall(SYS_prctl, ...)` (`exports::syscall`): a
//! program that makes the system call through libc's `syscall` meets the same rules.

use crate::conn::{holders_file, table};
use crate::real;
use libc::{c_int, c_ulong};

/// Whether `prctl(option, a2, ...)` is refused, with `errno` set to `EPERM`; leaves the process
/// first (`confine`) if it installs a seccomp filter. The shim refuses to make a process
/// dumpable again while its uid differs from the one its image started with and it holds a
/// connection: that connection's peer judged it by its uid at the handshake (as the same user,
/// maybe) and reads its rings through the mapping, and a dumpable process is its new user's to
/// take descriptors from and write into (a server that accepts as root, then drops to nobody
/// and asks to be dumpable for core dumps would hand nobody the rings of root's client; the
/// kernel made it undumpable at the change), or maps a holders file of another uid (a fork
/// child's, its parent's pages, whose turns nobody would hold to hang the parent's calls).
/// nginx's workers (no connection, nor one in the master before their fork) are not concerned.
pub fn refused(option: c_int, a2: c_ulong) -> bool {
    if crate::api::confine::prctl_confines(option, a2) {
        crate::api::confine::leave_process();
    }
    let refuse = option == libc::PR_SET_DUMPABLE
        && a2 != 0
        && crate::base::uids::changed()
        && (table::fds_of_kind(table::CONN).next().is_some() || table::fds_of_kind(table::PENDING).next().is_some() || holders_file::of_another_uid());
    if refuse {
        crate::base::guard::set_errno(libc::EPERM);
    }
    refuse
}

/// `prctl(2)`, through [`refused`].
/// Variadic in C; the kernel takes four arguments after the option, passed in registers.
#[no_mangle]
pub unsafe extern "C" fn prctl(option: c_int, a2: c_ulong, a3: c_ulong, a4: c_ulong, a5: c_ulong) -> c_int {
    if refused(option, a2) {
        return -1;
    }
    // SAFETY: libc's `prctl`, given the application's arguments unchanged.
    unsafe { real::prctl(option, a2, a3, a4, a5) }
}
