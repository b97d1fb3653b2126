//! Test helpers: watchdogs, child processes, fd accounting.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Aborts the whole test process if the test holding the guard runs longer than `secs`.
#[must_use = "the watchdog is disarmed when the guard drops"]
pub struct Watchdog(Option<std::sync::mpsc::Sender<()>>);

pub fn watchdog(secs: u64) -> Watchdog {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(secs)) {
            eprintln!("watchdog: test hung for {secs}s");
            std::process::abort();
        }
    });
    Watchdog(Some(tx))
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// Runs the test named `entry` of this same test binary in a child process, with `COLO_CHILD`
/// set to `role` (the entry does nothing without it).
pub fn child(entry: &str, role: &str, arg: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", entry, "--nocapture", "--test-threads=1"])
        .env("COLO_CHILD", role)
        .env("COLO_CHILD_ARG", arg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The role this process was started for, if it is a child.
pub fn role() -> Option<(String, String)> {
    let r = std::env::var("COLO_CHILD").ok()?;
    Some((r, std::env::var("COLO_CHILD_ARG").unwrap_or_default()))
}

/// Descriptors open in this process, by what they point to.
pub fn open_fds() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

pub fn count_memfds() -> usize {
    open_fds().iter().filter(|l| l.contains("colo-seg")).count()
}

/// Byte `i` of the test pattern.
pub fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(2654435761) >> 13) as u8
}

/// Serves one connection of `l` in a thread: reads two bytes and sends them back (the client a
/// test makes after its abuse of the listener shows it still serves).
pub fn echo_two_bytes(l: colo::Listener) -> std::thread::JoinHandle<()> {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 2];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b).unwrap();
    })
}

/// Connects to the rendezvous `colo-<our pid>-<port>` in the netns directory `dir`, then, once
/// the server has had time to settle into its wait, sends it a HELLO that proves no nonce (64
/// zero bytes, no descriptors); true if anything comes back within 10 s (a REJECT).
pub fn forged_hello_answered(dir: &std::path::Path, port: u16) -> bool {
    use colo_sys::{pathsock, seqpacket};
    let name = format!("colo-{}-{port}", std::process::id());
    let (d, _) = pathsock::open_dir(dir).unwrap();
    let control = pathsock::connect_at(std::os::fd::AsFd::as_fd(&d), name.as_bytes(), Duration::from_secs(5)).unwrap();
    // The connection first, the HELLO later: an answer must not need a look of the server's
    // that the connection's arrival prompted.
    std::thread::sleep(Duration::from_millis(100));
    seqpacket::send(&control, &[0u8; 64], &[]).unwrap();
    seqpacket::set_recv_timeout(&control, Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    seqpacket::recv(&control, &mut buf, false).is_ok_and(|r| r.len > 0)
}
