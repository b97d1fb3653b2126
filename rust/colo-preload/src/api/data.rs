//! The data calls: read(2), write(2) and the recv/send family on one descriptor. Each starts with
//! `with_conn!`; the accelerated path reads or writes the rings (`conn::io`) and answers with
//! errno as kernel TCP would.

use crate::api::route::{epipe_signal, owed_first, plain, plain_first, result, with_conn};
use crate::api::sockopt::inq_wanted;
use crate::base::mem::{slice, slice_mut};
use crate::conn::io::{conn_readv, conn_recv, conn_send, conn_writev, recv_discard};
use crate::conn::table::{self, CONN};
use crate::real;
use libc::{c_int, c_void, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};

plain_first! {
    read => read_slow(fd, buf: *mut c_void, n: size_t) -> ssize_t;
    readv => readv_slow(fd, iov: *const iovec, cnt: c_int) -> ssize_t;
    write => write_slow(fd, buf: *const c_void, n: size_t) -> ssize_t;
    writev => writev_slow(fd, iov: *const iovec, cnt: c_int) -> ssize_t;
    recvfrom => recvfrom_slow(fd, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    sendto => sendto_slow(fd, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
}

// ---- reading --------------------------------------------------------------------------------

#[inline(never)]
unsafe fn read_slow(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if let Some(r) = owed_first(fd, 0) {
        return r;
    }
    with_conn!(
        fd,
        // SAFETY: the application's arguments, as read(2) takes them.
        unsafe { real::read(fd, buf, n) },
        |g, c| {
            if n == 0 {
                // As read(2) on a socket: nothing asked, nothing waited for.
                return g.ok(0);
            }
            // SAFETY: read(2)'s contract: `n` writable bytes at `buf`, the application's.
            let b = unsafe { slice_mut(buf as *mut u8, n) };
            let r = conn_recv(&c, b, 0);
            result(&g, r)
        }
    )
}

#[inline(never)]
unsafe fn recvfrom_slow(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if flags & libc::MSG_ERRQUEUE != 0 {
        // SAFETY: the application's arguments, as recvfrom(2) takes them.
        return unsafe { real::recvfrom(fd, buf, n, flags, addr, len) };
    }
    if let Some(r) = owed_first(fd, flags) {
        return r;
    }
    with_conn!(
        fd,
        // SAFETY: the application's arguments, as recvfrom(2) takes them.
        unsafe { real::recvfrom(fd, buf, n, flags, addr, len) },
        |g, c| {
            if flags & libc::MSG_OOB != 0 {
                return g.err(libc::EINVAL);
            }
            let r = if flags & libc::MSG_TRUNC != 0 {
                recv_discard(&c, n, flags)
            } else {
                // SAFETY: recvfrom(2)'s contract: `n` writable bytes at `buf`.
                conn_recv(&c, unsafe { slice_mut(buf as *mut u8, n) }, flags)
            };
            if r.is_ok() && !addr.is_null() {
                // A connected stream socket reports no source address: the kernel sets the
                // length to 0, after the read; a length it cannot read or that is negative fails
                // the call then (EFAULT, EINVAL), the bytes read gone.
                if len.is_null() {
                    return g.err(libc::EFAULT);
                }
                // SAFETY: a non-null `len` is the application's writable address length.
                if unsafe { *len } as i32 >= 0 {
                    // SAFETY: as above.
                    unsafe { *len = 0 };
                } else {
                    return g.err(libc::EINVAL);
                }
            }
            result(&g, r)
        }
    )
}

#[inline(never)]
unsafe fn readv_slow(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if let Some(r) = owed_first(fd, 0) {
        return r;
    }
    with_conn!(
        fd,
        // SAFETY: the application's arguments, as readv(2) takes them.
        unsafe { real::readv(fd, iov, cnt) },
        |g, c| {
            if !(0..=1024).contains(&cnt) {
                return g.err(libc::EINVAL);
            }
            // SAFETY: readv(2)'s contract: `cnt` iovecs at `iov` (0 <= cnt <= IOV_MAX, checked).
            let v = unsafe { slice(iov, cnt as usize) };
            let r = conn_readv(&c, v, 0);
            result(&g, r)
        }
    )
}

/// `recvmsg`, then each listening socket the message carried becomes a colo listener of this
/// process's (`passed::after_recv`): such a socket comes over a Unix socket, a plain descriptor,
/// which `with_conn!` hands to libc and returns from at once, so the look is made here, after
/// whichever path served the call.
pub unsafe fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's contract, passed on.
    let r = unsafe { recvmsg_served(fd, msg, flags) };
    if r >= 0 {
        // SAFETY: the application's msghdr, which the call just filled.
        unsafe { crate::api::passed::after_recv(msg) };
    }
    r
}

/// A read of the error queue (`MSG_ERRQUEUE`) goes to the kernel's socket, whatever the
/// connection: the queue holds the notifications of the socket's own sends (`MSG_ZEROCOPY`,
/// `SO_TIMESTAMPING`), never the stream's bytes, and such a read never waits (an empty queue:
/// EAGAIN). The rings have neither urgent data nor an error queue.
unsafe fn recvmsg_served(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    if flags & libc::MSG_ERRQUEUE != 0 {
        // SAFETY: the application's arguments, as recvmsg(2) takes them.
        return unsafe { real::recvmsg(fd, msg, flags) };
    }
    if let Some(r) = owed_first(fd, flags) {
        return r;
    }
    with_conn!(
        fd,
        // SAFETY: the application's arguments, as recvmsg(2) takes them.
        unsafe { real::recvmsg(fd, msg, flags) },
        |g, c| {
            if flags & libc::MSG_OOB != 0 {
                // No urgent data is ever pending on the rings (as `recvfrom`).
                return g.err(libc::EINVAL);
            }
            // SAFETY: recvmsg(2)'s contract: `msg` is the application's writable msghdr.
            let m = unsafe { &mut *msg };
            // SAFETY: the `msg_iovlen` iovecs it points to, the application's.
            let v = unsafe { slice(m.msg_iov, m.msg_iovlen) };
            let r = conn_readv(&c, v, flags);
            if r.is_ok() {
                // A connected stream socket reports no source address (the kernel sets the
                // length to 0) and no control message but `TCP_CM_INQ`; of the flags asked, the
                // kernel hands `MSG_CMSG_CLOEXEC` back in `msg_flags`.
                m.msg_namelen = 0;
                m.msg_flags = flags & libc::MSG_CMSG_CLOEXEC;
                if inq_wanted(fd, &c) {
                    // SAFETY: the application's msghdr, its control buffer as recvmsg(2) takes it.
                    unsafe { put_inq(m, c.inq_hint()) };
                } else {
                    m.msg_controllen = 0;
                }
            }
            result(&g, r)
        }
    )
}

/// Puts the control message `TCP_CM_INQ` of `inq` in `m`'s control buffer, as the kernel's
/// `put_cmsg`: cut to the buffer's length (`MSG_CTRUNC`), none in a buffer shorter than a
/// header; `msg_controllen` becomes the length used.
///
/// # Safety
/// `m.msg_control` is null or the application's writable buffer of `m.msg_controllen` bytes.
unsafe fn put_inq(m: &mut msghdr, inq: usize) {
    let v = c_int::try_from(inq).unwrap_or(c_int::MAX);
    let head = std::mem::size_of::<libc::cmsghdr>();
    let room = m.msg_controllen;
    if m.msg_control.is_null() || room < head {
        m.msg_flags |= libc::MSG_CTRUNC;
        m.msg_controllen = 0;
        return;
    }
    // SAFETY: CMSG_LEN and CMSG_SPACE only compute.
    let (full, space) = unsafe { (libc::CMSG_LEN(4) as usize, libc::CMSG_SPACE(4) as usize) };
    let len = full.min(room);
    if len < full {
        m.msg_flags |= libc::MSG_CTRUNC;
    }
    let mut cm = [0u8; 32];
    let hdr = libc::cmsghdr { cmsg_len: len, cmsg_level: libc::IPPROTO_TCP, cmsg_type: libc::TCP_CM_INQ };
    // SAFETY: `cm` holds a header and an int; plain bytes of ours.
    unsafe {
        std::ptr::write_unaligned(cm.as_mut_ptr().cast(), hdr);
        std::ptr::write_unaligned(cm.as_mut_ptr().add(head).cast(), v);
        // The application's buffer, `room >= len` bytes (checked).
        std::ptr::copy_nonoverlapping(cm.as_ptr(), m.msg_control.cast::<u8>(), len);
    }
    m.msg_controllen = space.min(room);
}

/// `recvmmsg` on an accelerated stream: as the kernel, each message is one `recvmsg`; after the
/// first, `MSG_WAITFORONE` makes the rest non-blocking, and the call ends at the first that
/// would block or fails (returning the messages filled so far, or the first one's error). Only
/// an established connection is served; a pending connect goes to the kernel.
pub unsafe fn recvmmsg(fd: c_int, v: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int, t: *mut libc::timespec) -> c_int {
    if let Some(r) = owed_first(fd, flags) {
        return r as c_int;
    }
    if plain(fd) || table::kind(fd) != CONN {
        // SAFETY: the application's arguments, as recvmmsg(2) takes them.
        return unsafe { real::recvmmsg(fd, v, n, flags, t) };
    }
    let mut flags = flags;
    let mut done: c_int = 0;
    for i in 0..n as usize {
        // SAFETY: recvmmsg(2)'s contract: `n` writable mmsghdrs at `v`.
        let m = unsafe { &mut *v.add(i) };
        // SAFETY: the application's message header, within the array above.
        let r = unsafe { recvmsg(fd, &mut m.msg_hdr, flags & !libc::MSG_WAITFORONE) };
        if r < 0 {
            return if done > 0 { done } else { -1 };
        }
        m.msg_len = r as u32;
        done += 1;
        if flags & libc::MSG_WAITFORONE != 0 {
            flags |= libc::MSG_DONTWAIT;
        }
    }
    done
}

// ---- writing --------------------------------------------------------------------------------

#[inline(never)]
unsafe fn write_slow(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    with_conn!(
        fd,
        // SAFETY: the application's arguments, as write(2) takes them.
        unsafe { real::write(fd, buf, n) },
        |g, c| {
            // SAFETY: write(2)'s contract: `n` readable bytes at `buf`.
            let b = unsafe { slice(buf as *const u8, n) };
            let r = conn_send(&c, b, 0);
            epipe_signal(&r, 0);
            result(&g, r)
        }
    )
}

#[inline(never)]
unsafe fn sendto_slow(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    with_conn!(
        fd,
        // SAFETY: the application's arguments, as sendto(2) takes them.
        unsafe { real::sendto(fd, buf, n, flags, addr, len) },
        |g, c| {
            if flags & libc::MSG_OOB != 0 {
                return g.err(libc::EOPNOTSUPP);
            }
            // SAFETY: sendto(2)'s contract: `n` readable bytes at `buf`.
            let b = unsafe { slice(buf as *const u8, n) };
            let r = conn_send(&c, b, flags);
            epipe_signal(&r, flags);
            result(&g, r)
        }
    )
}

#[inline(never)]
unsafe fn writev_slow(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    with_conn!(
        fd,
        // SAFETY: the application's arguments, as writev(2) takes them.
        unsafe { real::writev(fd, iov, cnt) },
        |g, c| {
            if !(0..=1024).contains(&cnt) {
                return g.err(libc::EINVAL);
            }
            // SAFETY: writev(2)'s contract: `cnt` iovecs at `iov` (0 <= cnt <= IOV_MAX, checked).
            let v = unsafe { slice(iov, cnt as usize) };
            let r = conn_writev(&c, v, 0);
            epipe_signal(&r, 0);
            result(&g, r)
        }
    )
}

pub unsafe fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the application's msghdr, as sendmsg(2) takes it.
    unsafe { crate::api::passed::before_send(msg) };
    with_conn!(
        fd,
        // SAFETY: the application's arguments, as sendmsg(2) takes them.
        unsafe { real::sendmsg(fd, msg, flags) },
        |g, c| {
            // SAFETY: sendmsg(2)'s contract: `msg` is the application's msghdr, and its
            // `msg_iovlen` iovecs are readable.
            let v = unsafe { slice((*msg).msg_iov, (*msg).msg_iovlen) };
            // A message of no bytes is a send of nothing, which the socket's state may refuse
            // (a `writev` of none returns 0 before the kernel asks the socket).
            let r = if v.iter().all(|i| i.iov_len == 0) { conn_send(&c, &[], flags) } else { conn_writev(&c, v, flags) };
            epipe_signal(&r, flags);
            result(&g, r)
        }
    )
}

/// `sendmmsg` on an accelerated stream: each message one `sendmsg`, up to the first that fails
/// (the count so far, or -1 and its errno). Only an established connection is served.
pub unsafe fn sendmmsg(fd: c_int, v: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int) -> c_int {
    if plain(fd) || table::kind(fd) != CONN {
        for i in 0..n as usize {
            // SAFETY: sendmmsg(2)'s contract: `n` readable mmsghdrs at `v`.
            unsafe { crate::api::passed::before_send(&(*v.add(i)).msg_hdr) };
        }
        // SAFETY: the application's arguments, as sendmmsg(2) takes them.
        return unsafe { real::sendmmsg(fd, v, n, flags) };
    }
    let mut done = 0;
    for i in 0..n as usize {
        // SAFETY: sendmmsg(2)'s contract: `n` writable mmsghdrs at `v`.
        let m = unsafe { &mut *v.add(i) };
        // SAFETY: the application's message header, within the array above.
        let r = unsafe { sendmsg(fd, &m.msg_hdr, flags) };
        if r < 0 {
            return if done > 0 { done } else { -1 };
        }
        m.msg_len = r as u32;
        done += 1;
    }
    done
}
