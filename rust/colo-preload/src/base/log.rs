//! `COLO_LOG=info|debug`: lines to stderr written with a raw system call (no libc, so no
//! recursion into the shim and no stdio lock). Never into a TCP connection: an inetd-style
//! server (xinetd) gives its program the connection as descriptor 2 as well, and a log line
//! there would be bytes in the peer's stream. Nor under a file-size limit: a write past it
//! (a sandbox sets it to 0, as OpenSSH's does) raises `SIGXFSZ`, which kills the program.

use std::sync::OnceLock;

pub fn log_level() -> u8 {
    static L: OnceLock<u8> = OnceLock::new();
    *L.get_or_init(|| match std::env::var("COLO_LOG").map(|v| v.to_ascii_lowercase()).as_deref() {
        Ok("debug") => 2,
        Ok("info") => 1,
        _ => 0,
    })
}

pub fn log_info(args: std::fmt::Arguments<'_>) {
    if log_level() >= 1 && !colo_sys::host::stderr_is_network() && rustix::process::getrlimit(rustix::process::Resource::Fsize).current.is_none() {
        let line = format!("colo[{}]: {args}\n", colo_sys::host::pid());
        // SAFETY: write(2) of `line`'s `len` initialized bytes, which outlive the call, to fd 2.
        unsafe { libc::syscall(libc::SYS_write, 2, line.as_ptr(), line.len()) };
    }
}

pub fn log_debug(args: std::fmt::Arguments<'_>) {
    if log_level() >= 2 {
        log_info(args);
    }
}

