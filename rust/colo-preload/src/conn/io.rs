//! Reading and writing an accelerated connection as a TCP socket reads and writes: recv(2)
//! flags, `SO_RCVLOWAT`, blocking and non-blocking writes, a small `SO_SNDBUF`, and the reset
//! and end-of-stream answers kernel TCP gives.

use crate::conn::state::{Conn, ERR, IN, OUT};
use colo::errno_of;
use colo::internal::shm::{continues_blocking_call, signals_end_waits, Drainer, Shm};
use libc::{c_int, iovec};
use std::io;
use std::time::Instant;

// ---- reading --------------------------------------------------------------------------------

fn would_block() -> io::Error {
    io::Error::from_raw_os_error(libc::EAGAIN)
}

/// Reads with recv(2) flags (MSG_PEEK, MSG_DONTWAIT, MSG_WAITALL).
#[inline]
pub fn conn_recv(c: &Conn, buf: &mut [u8], flags: c_int) -> io::Result<usize> {
    match conn_recv_inner(c, buf, flags) {
        // The peer exited without closing (no FIN in the ring) after reading all we sent: its
        // kernel would have closed the TCP socket gracefully, so this is end of stream. A reset
        // is reported once, as the kernel's socket error; then reads see end of stream. A reset
        // after the peer's FIN reads as end of stream at once, and stays the socket's error.
        Err(e) if errno_of(&e) == libc::ECONNRESET && (c.peer_exited_cleanly() || c.peer_reset_after_fin() || !c.report_reset()) => Ok(0),
        r => r,
    }
}

fn conn_recv_inner(c: &Conn, buf: &mut [u8], flags: c_int) -> io::Result<usize> {
    c.adopt_read_shut();
    // What a relayed program that exited had read is off the ring first (`service::downward`).
    c.wait_read();
    if buf.is_empty() {
        return recv_nothing(c, flags);
    }
    if flags & libc::MSG_DONTWAIT != 0 && !c.nonblocking() && c.ready_quick() & IN == 0 && c.arm_quick(Drainer::Awake) & IN == 0 {
        return Err(would_block());
    }
    if flags & libc::MSG_PEEK != 0 {
        // A blocking peek waits for its target as a read does (MSG_WAITALL: all of it).
        let target = if flags & libc::MSG_WAITALL != 0 { buf.len() } else { c.lowat() };
        if c.nonblocking() {
            return c.shm().peek(buf);
        }
        if flags & libc::MSG_DONTWAIT != 0 {
            return c.shm().try_peek(buf);
        }
        if target > 1 {
            return c.shm().peek_least(buf, target);
        }
        return c.shm().peek(buf);
    }
    let turn = c.read_turn(c.nonblocking() || flags & libc::MSG_DONTWAIT != 0)?;
    // One timeout covers the call, as the kernel's: from the wait for the turn, else from now
    // (a clock read only on a socket with a timeout).
    let since = turn.as_ref().and_then(|t| t.since()).or_else(|| c.shm().read_timeout().map(|_| Instant::now()));
    let mut n = c.shm().read_since(buf, since)?;
    // MSG_WAITALL waits for all; a blocking read otherwise for SO_RCVLOWAT bytes (1 by default);
    // a call that must not wait (MSG_DONTWAIT, even with MSG_WAITALL) returns what it read.
    let all = flags & libc::MSG_WAITALL != 0;
    let target = if all { buf.len() } else { c.lowat().min(buf.len()) };
    if n < target && !c.nonblocking() && flags & libc::MSG_DONTWAIT == 0 {
        while n < target {
            // A signal now ends the call with the bytes read (`signals_end_waits`).
            match signals_end_waits(|| c.shm().read_since(&mut buf[n..], since)) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(_) if n > 0 => break,
                Err(e) => return Err(e),
            }
        }
    }
    after_read(c, n, buf.len());
    Ok(n)
}

/// Keeps the kernel fds honest for level-triggered pollers: if the buffer was filled, more
/// may be waiting, so make sure the doorbell stays rung; a ring of ours still undrained does
/// that already (`Shm::keep_self_rung`), and a program that reads a message in pieces (a
/// header byte at a time) rings once, not once a piece. (A short read needs nothing: every
/// drain of the doorbell announces a wait, so either the doorbell holds a count or the peer's
/// next progress rings it; and `epoll_wait`/`poll` read the rings before sleeping.)
#[inline]
pub fn after_read(c: &Conn, n: usize, len: usize) {
    if n > 0 {
        c.got_reply();
    }
    if n == len && n > 0 && c.shm().readable().unwrap_or(0) > 0 {
        c.shm().keep_self_rung();
    }
}

#[inline]
pub fn conn_readv(c: &Conn, iov: &[iovec], flags: c_int) -> io::Result<usize> {
    c.adopt_read_shut();
    c.wait_read();
    let mut total = 0;
    for (i, v) in iov.iter().enumerate() {
        if v.iov_len == 0 {
            continue;
        }
        // SAFETY: the application gave us this buffer for writing.
        let buf = unsafe { std::slice::from_raw_parts_mut(v.iov_base as *mut u8, v.iov_len) };
        if i > 0 && total > 0 && c.shm().readable().unwrap_or(0) == 0 {
            break;
        }
        // The later buffers take what is there now, each with the readers' turn of its own.
        let r = if total == 0 {
            conn_recv(c, buf, flags)
        } else {
            match c.read_turn(true) {
                Ok(_turn) => c.shm().read(buf),
                Err(e) => Err(e),
            }
        };
        match r {
            Ok(0) => break,
            Ok(n) => {
                total += n;
                if n < buf.len() {
                    break;
                }
            }
            Err(_) if total > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

// ---- writing --------------------------------------------------------------------------------

/// Where a send's bytes come from: the application's buffer, or a file (`sendfile`).
pub trait Source {
    /// The bytes asked for.
    fn len(&self) -> usize;
    /// Writes up to `max` of the bytes from `from` on into the connection's ring, as
    /// [`Shm::write_since`] does; returns how many.
    fn put(&self, shm: &Shm, from: usize, max: usize, since: Option<Instant>) -> io::Result<usize>;
    /// Whether the bytes ran out before `len` (a file shorter than asked for, or unreadable).
    fn ended(&self) -> bool {
        false
    }
}

impl Source for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn put(&self, shm: &Shm, from: usize, max: usize, since: Option<Instant>) -> io::Result<usize> {
        shm.write_since(&self[from..self.len().min(from + max)], since)
    }
}

#[inline]
pub fn conn_send(c: &Conn, buf: &[u8], flags: c_int) -> io::Result<usize> {
    conn_send_from(c, buf, flags)
}

/// [`conn_send`] of the bytes of `src`.
pub fn conn_send_from<S: Source + ?Sized>(c: &Conn, src: &S, flags: c_int) -> io::Result<usize> {
    let nothing = src.len() == 0;
    match conn_send_inner(c, src, flags) {
        // A send of nothing sends no segment to be answered with a reset: a peer's close or
        // read shutdown alone leaves it taken (kernel TCP's CLOSE_WAIT).
        Err(e) if nothing && errno_of(&e) == libc::EPIPE && c.refused_by_peer_close_only() => Ok(0),
        // Kernel TCP takes the first write after the peer closed (see `takes_write_after_close`).
        Err(e) if !nothing && errno_of(&e) == libc::EPIPE && c.takes_write_after_close() => Ok(src.len()),
        // The rings end a write to a peer that went without reading all of ours (killed, or
        // closed with bytes unread) as a closed stream: its kernel would have reset, which the
        // first write to fail reports (and `SO_ERROR` no longer does), as kernel TCP's.
        Err(e) if errno_of(&e) == libc::EPIPE && c.peer_reset() && !c.peer_reset_after_fin() && c.report_reset() => {
            Err(io::Error::from_raw_os_error(libc::ECONNRESET))
        }
        // A reset is reported once (the kernel's socket error); later writes fail as after it.
        // A reset after the peer's FIN is the kernel's EPIPE, the first time too.
        Err(e) if errno_of(&e) == libc::ECONNRESET && (!c.report_reset() || c.peer_reset_after_fin()) => {
            Err(io::Error::from_raw_os_error(libc::EPIPE))
        }
        // The write that fails after a taken one reports the reset that answered it (the
        // kernel's EPIPE in CLOSE_WAIT), which then leaves the socket's error.
        Err(e) if errno_of(&e) == libc::EPIPE && c.wrote_after_close() => {
            c.report_reset();
            Err(e)
        }
        r => r,
    }
}

fn conn_send_inner<S: Source + ?Sized>(c: &Conn, src: &S, flags: c_int) -> io::Result<usize> {
    if src.len() == 0 {
        // Writes nothing, but fails as a send does once the stream is shut down for writing or
        // reset: kernel TCP looks at the socket's state before the length. That state includes
        // a write shutdown another process holding the socket made (its FIN in our ring).
        c.shm().adopt_write_shut();
        return c.shm().send_refused().map(|()| 0);
    }
    // Each call's bytes stay contiguous when processes share the connection (`turns`). A
    // non-blocking call does not wait for the turn while its holder waits for room (a peer that
    // does not read would hold it there): it would block, so `EAGAIN`.
    // A call that continues a blocking one (a writev's later gathers) blocks whatever
    // `O_NONBLOCK` says now: the kernel decides that once, at a call's start.
    let nb = (c.nonblocking() && !continues_blocking_call()) || flags & libc::MSG_DONTWAIT != 0;
    let turn = if nb { c.try_write_turn()? } else { c.write_turn()? };
    if nb {
        if !c.nonblocking() && c.ready(false) & OUT == 0 && c.arm(Drainer::Awake, true) & OUT == 0 {
            return Err(would_block());
        }
        if c.send_limited() {
            return send_bounded(c, src);
        }
        return src.put(c.shm(), 0, src.len(), None);
    }
    // Blocking sockets write everything (or fail), within one timeout for the call, counted as
    // a read's is.
    let since = turn.as_ref().and_then(|t| t.since()).or_else(|| c.shm().write_timeout().map(|_| Instant::now()));
    let mut done = 0;
    while done < src.len() && !src.ended() {
        // Once bytes are written, a signal ends the call with them (`signals_end_waits`).
        let put = || src.put(c.shm(), done, src.len() - done, since);
        match if done == 0 { put() } else { signals_end_waits(put) } {
            Ok(n) => done += n,
            Err(_) if done > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

thread_local! {
    static GATHER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

const GATHER_MAX: usize = 256 * 1024;

#[inline]
pub fn conn_writev(c: &Conn, iov: &[iovec], flags: c_int) -> io::Result<usize> {
    let nonempty: Vec<&iovec> = iov.iter().filter(|v| v.iov_len > 0).collect();
    if nonempty.len() == 1 {
        // SAFETY: the application's buffer, valid for reading.
        let b = unsafe { std::slice::from_raw_parts(nonempty[0].iov_base as *const u8, nonempty[0].iov_len) };
        return conn_send(c, b, flags);
    }
    // A blocking socket writes every iovec (as the kernel does), in gathers of at most
    // GATHER_MAX bytes; a non-blocking one writes what one gather takes.
    let blocking = !c.nonblocking() && flags & libc::MSG_DONTWAIT == 0;
    GATHER.with(|g| {
        let mut g = g.borrow_mut();
        let (mut i, mut off, mut done) = (0, 0, 0);
        while i < nonempty.len() {
            g.clear();
            while i < nonempty.len() && g.len() < GATHER_MAX {
                let v = nonempty[i];
                let take = (v.iov_len - off).min(GATHER_MAX - g.len());
                // SAFETY: the application's buffer, valid for reading; `off + take <= iov_len`.
                let b = unsafe { std::slice::from_raw_parts((v.iov_base as *const u8).add(off), take) };
                g.extend_from_slice(b);
                off += take;
                if off == v.iov_len {
                    i += 1;
                    off = 0;
                }
            }
            let send = || conn_send(c, &g, flags);
            match if done == 0 { send() } else { signals_end_waits(send) } {
                Ok(n) => {
                    done += n;
                    if n < g.len() || !blocking {
                        break;
                    }
                }
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    })
}

// ---- edge cases kernel TCP answers so ---------------------------------------------------

/// A non-blocking write on a connection a small `SO_SNDBUF` bounds (`Conn::set_send_limit`):
/// what fits below the bound, or `EAGAIN`.
#[inline]
pub fn send_bounded<S: Source + ?Sized>(c: &Conn, src: &S) -> io::Result<usize> {
    let room = c.space();
    if room == 0 {
        // Errors (a reset, a closed peer) first, as the kernel reports them before EAGAIN.
        if c.ready(true) & ERR != 0 {
            return src.put(c.shm(), 0, src.len(), None);
        }
        return Err(io::Error::from_raw_os_error(libc::EAGAIN));
    }
    src.put(c.shm(), 0, room, None)
}

/// A read of zero bytes (`recv(fd, buf, 0, flags)`): as kernel TCP, `EAGAIN` when nothing is
/// readable and the call may not wait, 0 once something is (bytes, end of stream, or an error
/// reported by the read that follows); a blocking one waits until then.
#[inline]
pub fn recv_nothing(c: &Conn, flags: c_int) -> io::Result<usize> {
    if c.nonblocking() || flags & libc::MSG_DONTWAIT != 0 {
        if c.ready_quick() & IN == 0 {
            return Err(io::Error::from_raw_os_error(libc::EAGAIN));
        }
        return Ok(0);
    }
    c.shm().wait_readable().map(|()| 0)
}

/// `recv(fd, _, n, MSG_TRUNC)` on TCP: reads up to `n` bytes as `recv` would and discards them
/// (the buffer is not written; it may be null); returns how many.
#[inline]
pub fn recv_discard(c: &Conn, n: usize, flags: c_int) -> io::Result<usize> {
    let mut scratch = [0u8; 16 * 1024];
    let first = n.min(scratch.len());
    let mut total = conn_recv(c, &mut scratch[..first], flags & !libc::MSG_TRUNC)?;
    if flags & libc::MSG_PEEK != 0 || total < first {
        return Ok(total);
    }
    // More only while bytes are there now (a stream read returns what has arrived).
    let Ok(_turn) = c.read_turn(true) else { return Ok(total) };
    while total < n && c.available().unwrap_or(0) > 0 {
        let k = (n - total).min(scratch.len());
        match c.shm().read(&mut scratch[..k]) {
            Ok(0) | Err(_) => break,
            Ok(got) => total += got,
        }
    }
    Ok(total)
}
