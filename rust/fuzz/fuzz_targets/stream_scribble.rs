//! A live connection between two `colo::Stream`s of this process whose segment a hostile peer
//! scribbles on: arbitrary values stored into the shared words of both directions (ring
//! counters and flags, message and free queue counters and entries) between reads, writes,
//! zero-copy sends, receives and releases on both ends. This drives colo's own consumer and
//! producer (rust/colo/src/shm.rs), where `ring_scribble` drives colo-ring's halves directly.
//!
//! Checked: no panic, no hang (both ends are non-blocking; libFuzzer's -timeout catches the
//! rest), every count within what was asked, every received message within its slot, every error
//! one a hostile peer may cause (EPROTO, a reset, a broken pipe, WouldBlock, the pool's own
//! refusals). Input: two geometry bytes, then records of an operation byte, a 16-bit offset and
//! a 64-bit value.
#![no_main]

use colo_ring::layout::Layout;
use colo::wire::{Header, HEADER_FIELDS};
use colo::{Listener, Options, Stream, Transport};
use colo_ring::layout::{HEADER_SIZE, PARKED};
use libfuzzer_sys::fuzz_target;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// One listener for the whole run, with a thread accepting into a channel.
fn listener() -> &'static (SocketAddr, Mutex<Receiver<Stream>>) {
    static L: OnceLock<(SocketAddr, Mutex<Receiver<Stream>>)> = OnceLock::new();
    L.get_or_init(|| {
        let l = Listener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            while let Ok((s, _)) = l.accept() {
                if tx.send(s).is_err() {
                    return;
                }
            }
        });
        (addr, Mutex::new(rx))
    })
}

/// A shared mapping of the live connection's segment (header names our listener, nobody has
/// parked it), found through this process's descriptors.
struct Mapped {
    base: *mut u8,
    layout: Layout,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map_live`, used by nothing after this.
        unsafe { libc::munmap(self.base.cast(), self.layout.segment_size) };
    }
}

fn map_live(port: u16) -> Option<Mapped> {
    for e in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        if !std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("colo-seg")) {
            continue;
        }
        let Ok(f) = std::fs::OpenOptions::new().read(true).write(true).open(e.path()) else { continue };
        let mut head = [0u8; HEADER_FIELDS + 8];
        if f.read_exact_at(&mut head, 0).is_err() {
            continue;
        }
        let Ok((h, layout)) = Header::decode(&head[..HEADER_FIELDS]) else { continue };
        let parked = u32::from_le_bytes(head[PARKED..PARKED + 4].try_into().unwrap());
        if h.server_addr.map(|a| a.port()) != Some(port) || parked != 0 {
            continue;
        }
        // SAFETY: a fresh shared mapping of the whole segment, unmapped by `Mapped::drop`.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), layout.segment_size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0)
        };
        if p != libc::MAP_FAILED {
            return Some(Mapped { base: p.cast(), layout });
        }
    }
    None
}

/// An error a hostile peer may cause (or a non-blocking call's WouldBlock).
fn expected(e: &std::io::Error) {
    let errno = colo::errno_of(e);
    let ok = matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::ConnectionRefused | ErrorKind::UnexpectedEof
    ) || [libc::EPROTO, libc::ENOBUFS, libc::EMSGSIZE, libc::EPIPE, libc::ECONNRESET, libc::EAGAIN, libc::ENOTCONN].contains(&errno);
    assert!(ok, "unexpected error {e:?} (errno {errno})");
}

fuzz_target!(|data: &[u8]| {
    let [a, b, ref ops @ ..] = *data else { return };
    // The scribbler finds the segment through its memfd, which colo otherwise closes once mapped.
    colo::internal::segment::keep_memfds(true);
    let (addr, accepted) = listener();
    let slots = u32::from(b % 9);
    let mut opts = Options::new().ring_capacity(4096 << (a % 3));
    if slots > 0 {
        opts = opts.pool(64 * u32::from(1 + (a >> 2) % 4), slots);
    }
    let Ok(c) = Stream::connect_with(*addr, &opts) else { return };
    let s = accepted.lock().unwrap().recv_timeout(Duration::from_secs(10)).expect("the listener accepted");
    assert_eq!(c.transport(), Transport::SharedMemory);
    let seg = map_live(addr.port()).expect("the connection's segment");
    let layout = seg.layout;
    let slot_size = layout.geometry.slot_size as usize;
    c.set_nonblocking(true).unwrap();
    s.set_nonblocking(true).unwrap();
    let mut held = Vec::new();
    let mut buf = vec![0u8; 2 * layout.geometry.ring_capacity as usize];
    for rec in ops.chunks_exact(11) {
        let (op, off, val) = (rec[0], u16::from_le_bytes([rec[1], rec[2]]) as usize, u64::from_le_bytes(rec[3..11].try_into().unwrap()));
        let (side, other) = if op & 0x80 != 0 { (&c, &s) } else { (&s, &c) };
        match (op & 0x7f) % 8 {
            0 => {
                // A store into the control area of one direction's block (before its data).
                let block = layout.block_offset(op & 0x40 != 0);
                let at = block + ((off % layout.data_off) & !7);
                assert!(at >= HEADER_SIZE && at + 8 <= layout.segment_size);
                // SAFETY: an aligned u64 inside our mapping of the segment.
                unsafe { (*(seg.base.add(at) as *const std::sync::atomic::AtomicU64)).store(val, std::sync::atomic::Ordering::Relaxed) };
            }
            1 => {
                let n = off % buf.len();
                match (&*side).read(&mut buf[..n]) {
                    Ok(k) => assert!(k <= n),
                    Err(e) => expected(&e),
                }
            }
            2 => {
                let n = off % buf.len();
                match (&*other).write(&buf[..n]) {
                    Ok(k) => assert!(k <= n),
                    Err(e) => expected(&e),
                }
            }
            3 | 7 => match side.recv_raw() {
                Ok(Some(m)) => {
                    if m.is_zero_copy() {
                        assert!(m.len() <= slot_size, "a message longer than its slot");
                    }
                    held.push((op & 0x80 != 0, m));
                }
                Ok(None) => {}
                Err(e) => expected(&e),
            },
            4 => match other.loan(off % (slot_size + 1)) {
                Ok(l) => {
                    if let Err(e) = l.send() {
                        expected(&e);
                    }
                }
                Err(e) => expected(&e),
            },
            5 => {
                for (on_client, m) in held.drain(..) {
                    let owner = if on_client { &c } else { &s };
                    // SAFETY: received on `owner` just above, released once, here.
                    unsafe { owner.release_raw(m) };
                }
            }
            _ => {
                if let Err(e) = side.shutdown(Shutdown::Write) {
                    expected(&e);
                }
            }
        }
    }
    for (on_client, m) in held.drain(..) {
        let owner = if on_client { &c } else { &s };
        // SAFETY: received on `owner`, released once, here.
        unsafe { owner.release_raw(m) };
    }
    drop(seg);
    drop((c, s));
});
