//! The C ABI of colo (`libcolo`, `include/colo.h`).
//!
//! Every exported function is `extern "C"`, named `colo_*`, and reports errors as negative errno
//! values. Handles (`colo_listener`, `colo_conn`, `colo_msg`, `colo_buf`) are opaque: their
//! pointer value is an index and a generation in a process-wide handle table (`handles/`), never
//! an address that the library dereferences. A NULL, closed, released or made-up handle is
//! therefore simply not found and gives `-EBADF`; a handle value is never reused, so a stale
//! handle cannot reach a newer object. Panics never cross the boundary: they become `-EIO`.
//!
//! `include/colo.h` is generated from this file with cbindgen (see `cbindgen.toml`); the doc
//! comments below are the header's documentation.
#![allow(non_camel_case_types)]
// The entry points are called from C: each pointer argument is checked for NULL and its contract
// (size, lifetime) is documented in colo.h, which is what an `unsafe fn` would say in Rust.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use colo::{Listener, Options, RawLoan, RawMessage, SpinMode, Stream, Transport};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

/// `ssize_t` in the header (cbindgen emits the name as written).
type ssize_t = isize;

mod errno {
    pub(crate) const EIO: i32 = 5;
    pub(crate) const EBADF: i32 = 9;
    pub(crate) const EINVAL: i32 = 22;
    pub(crate) const ENOMEM: i32 = 12;
    pub(crate) const ENOSPC: i32 = 28;
}

/// A listening colo endpoint (TCP plus shared-memory rendezvous). Opaque.
pub struct colo_listener {
    _private: [u8; 0],
}

/// One connection, over shared memory or TCP. Opaque.
pub struct colo_conn {
    _private: [u8; 0],
}

/// A received zero-copy message: a read-only view of bytes in the shared segment. Opaque.
pub struct colo_msg {
    _private: [u8; 0],
}

/// A buffer loaned for one outgoing zero-copy message. Opaque.
pub struct colo_buf {
    _private: [u8; 0],
}

/// Settings for `colo_listen` and `colo_connect`. Fill with `colo_options_init` first, then change
/// fields; pass NULL instead for the defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct colo_options {
    /// `sizeof(colo_options)`, set by `colo_options_init`; lets later versions add fields.
    pub size: u32,
    /// The largest each direction's byte ring grows to: a power of two from 4096 to 2^30 (default:
    /// tcp_wmem's maximum, rounded up; rings start at 2 KiB and grow as writes need).
    pub ring_capacity: u32,
    /// Bytes per zero-copy message slot (default 64 KiB); 0 with `slot_count` 0: no pool.
    pub slot_size: u32,
    /// Number of message slots per direction (default 16).
    pub slot_count: u32,
    /// Microseconds to spin before sleeping: `COLO_SPIN_DEFAULT` (the `COLO_SPIN_US`
    /// environment variable, else 5 us adaptive), 0 never, `COLO_SPIN_ALWAYS` busy-poll.
    pub spin_us: i64,
    /// How long the first `colo_connect` to a listener waits for its answer, in milliseconds
    /// (0: the default, 200), before it returns a pending shared-memory connection (bytes
    /// written meanwhile wait in the ring, as in a TCP backlog). Later connects to a listener
    /// that answered do not wait.
    pub connect_timeout_ms: u64,
}

/// `colo_options.spin_us`: use `COLO_SPIN_US` or the built-in default.
pub const COLO_SPIN_DEFAULT: i64 = -2;
/// `colo_options.spin_us`: spin and never sleep (busy polling; burns a CPU while waiting).
pub const COLO_SPIN_ALWAYS: i64 = -1;

/// `colo_shutdown`: stop reading.
pub const COLO_SHUT_RD: c_int = 0;
/// `colo_shutdown`: stop writing (the peer reads end of stream after the last byte).
pub const COLO_SHUT_WR: c_int = 1;
/// `colo_shutdown`: both.
pub const COLO_SHUT_RDWR: c_int = 2;

/// `colo_transport`: the connection runs over shared memory.
pub const COLO_TRANSPORT_SHM: c_int = 1;
/// `colo_transport`: the connection runs over plain TCP (remote or non-colo peer).
pub const COLO_TRANSPORT_TCP: c_int = 2;

/// `colo_accept` flag: put the accepted connection in non-blocking mode.
pub const COLO_NONBLOCK: c_int = 1;

/// A buffer of this many bytes holds any address text from `colo_*_addr`.
pub const COLO_ADDRSTRLEN: usize = 64;

// ---- the handle table ---------------------------------------------------------------------------

mod handles;
use handles::{Cx, Guard, Local, Ref, Table, TakeError, Taken};

/// Kinds of objects in the table.
const LISTENER: u8 = 1;
const CONN: u8 = 2;
const MSG: u8 = 3;
const LOAN: u8 = 4;

/// A received message and the reference that keeps its connection alive. Plain data and a
/// reference: a box is written into its entry and read out of it without the moves of a
/// borrowing `Message` (they stalled store forwarding on every call). `colo_msg_release` takes
/// the parts out of the taken entry (see `handles::Taken`); dropping the box releases the message.
struct MsgBox {
    msg: RawMessage,
    conn: Ref<Obj>,
}

/// A loaned buffer and its connection; dropping the box unsent gives the slot back.
struct LoanBox {
    loan: RawLoan,
    conn: Ref<Obj>,
}

impl Drop for MsgBox {
    fn drop(&mut self) {
        // SAFETY: the message came from `recv_raw` on the connection `conn` keeps alive, and a
        // box whose message was released is discarded, never dropped (`msg_parts`).
        unsafe { stream_of(&self.conn).release_raw(std::ptr::read(&self.msg)) }
    }
}

impl Drop for LoanBox {
    fn drop(&mut self) {
        // SAFETY: as for `MsgBox`: this stream's loan, neither sent nor cancelled (`loan_parts`).
        unsafe { stream_of(&self.conn).cancel_raw(std::ptr::read(&self.loan)) }
    }
}

// SAFETY: a message or loan points into the segment (or a heap buffer the box owns) of the
// connection that `conn` keeps alive. A box is shared only through table references, which only
// read it (`colo_msg_data` and the like); it is ended only by the one caller that took it out of
// its handle (`Cx::take`). `Stream` is `Send + Sync`.
unsafe impl Send for MsgBox {}
// SAFETY: as above.
unsafe impl Sync for MsgBox {}
// SAFETY: as for `MsgBox`.
unsafe impl Send for LoanBox {}
// SAFETY: as for `MsgBox`.
unsafe impl Sync for LoanBox {}

/// What a handle names; the variant always matches the kind the table stores with it.
enum Obj {
    Listener(Box<Listener>),
    Conn(Stream),
    Msg(MsgBox),
    Loan(LoanBox),
}

impl Obj {
    fn kind(&self) -> u8 {
        match self {
            Obj::Listener(_) => LISTENER,
            Obj::Conn(_) => CONN,
            Obj::Msg(_) => MSG,
            Obj::Loan(_) => LOAN,
        }
    }
}

thread_local! {
    static LOCAL: Local<Obj> = const { Local::new() };
    static GUARD: Guard<Obj> = const { Guard::new() };
}

/// Every live handle of the process. Handle values are multiples of 16, never 0, never reused.
static TABLE: Table<Obj> = Table::new(&LOCAL, &GUARD);

/// Stores the object `make` makes under a new handle (the caller's to free), or drops it unmade
/// and returns `-ENOMEM` if 2^28 - 1 handles are live. `make` should only move values into place
/// (see `Cx::insert_with`).
#[inline(always)]
fn insert(cx: &Cx<'_, Obj>, kind: u8, make: impl FnOnce() -> Obj) -> Result<usize, isize> {
    let make = || {
        let obj = make();
        debug_assert_eq!(obj.kind(), kind, "the kind stored with an object is its variant's");
        obj
    };
    cx.insert_with(kind, make).map_err(|make| {
        drop(make());
        -(errno::ENOMEM as isize)
    })
}

/// Runs `f` with this thread's side of the handle table (one thread-local lookup per call).
/// The lookup only takes the address: with the call's whole body inside `LocalKey::with`, the
/// compiler kept `with` out of line, and there the key is a parameter, reached through an
/// indirect call (about 20 instructions a call under callgrind).
#[inline]
fn with_cx<R>(f: impl FnOnce(&Cx<'_, Obj>) -> R) -> R {
    let l: *const Local<Obj> = LOCAL.with(std::ptr::from_ref);
    // SAFETY: this thread's `LOCAL`, which has no destructor: it lives until the thread exits,
    // and this call runs on the thread throughout.
    TABLE.cx_in(unsafe { &*l }, f)
}

/// A connection handle's stream, held by a counted reference (a closing thread cannot free it
/// under us). `Ref<Obj>` derefs to the `Obj`; `ConnRef` to the `Stream`.
struct ConnRef(Ref<Obj>);

impl std::ops::Deref for ConnRef {
    type Target = Stream;
    #[inline]
    fn deref(&self) -> &Stream {
        stream_of(&self.0)
    }
}

/// The stream of a reference to a connection entry.
#[inline]
fn stream_of(r: &Ref<Obj>) -> &Stream {
    match &**r {
        Obj::Conn(s) => s,
        _ => unreachable!("the table checked the kind"),
    }
}

fn conn(h: *const colo_conn) -> Result<ConnRef, isize> {
    TABLE.get_cached(h as usize, CONN).map(ConnRef).ok_or(EBADF)
}

/// `conn` within a call that has the table context.
#[inline]
fn conn_in(cx: &Cx<'_, Obj>, h: *const colo_conn) -> Result<ConnRef, isize> {
    cx.get_cached(h as usize, CONN).map(ConnRef).ok_or(EBADF)
}

/// A listener handle's listener, held by a counted reference.
struct ListenerRef(Ref<Obj>);

impl std::ops::Deref for ListenerRef {
    type Target = Listener;
    fn deref(&self) -> &Listener {
        match &*self.0 {
            Obj::Listener(l) => l,
            _ => unreachable!("the table checked the kind"),
        }
    }
}

fn listener(h: *const colo_listener) -> Result<ListenerRef, isize> {
    TABLE.get(h as usize, LISTENER).map(ListenerRef).ok_or(EBADF)
}

/// Reads something from the message or loan under `h`, if it is of kind `kind`.
#[inline]
fn with<R>(h: usize, kind: u8, f: impl FnOnce(&Obj) -> R) -> Option<R> {
    TABLE.get(h, kind).map(|r| f(&r))
}

/// The loan and connection reference of a taken loan handle (the entry is freed): the caller
/// ends the loan.
#[inline(always)]
fn loan_parts(t: Taken<'_, Obj>) -> (RawLoan, Ref<Obj>) {
    let Obj::Loan(b) = &*t else { unreachable!("the table checked the kind") };
    // SAFETY: the loan and the reference are read out once and the box is then discarded, not
    // dropped.
    let parts = unsafe { (std::ptr::read(&b.loan), std::ptr::read(&b.conn)) };
    t.discard();
    parts
}

/// The message and connection reference of a taken message handle (the entry is freed): the
/// caller releases the message.
#[inline(always)]
fn msg_parts(t: Taken<'_, Obj>) -> (RawMessage, Ref<Obj>) {
    let Obj::Msg(b) = &*t else { unreachable!("the table checked the kind") };
    // SAFETY: as in `loan_parts`.
    let parts = unsafe { (std::ptr::read(&b.msg), std::ptr::read(&b.conn)) };
    t.discard();
    parts
}

/// Takes the object of `kind` under `h` out of its handle (the handle dies) if `check` accepts it.
#[inline]
fn take<'a>(cx: &'a Cx<'_, Obj>, h: usize, kind: u8, check: impl FnOnce(&Obj) -> Result<(), isize>) -> Result<Taken<'a, Obj>, isize> {
    cx.take(h, kind, check).map_err(|e| match e {
        TakeError::BadHandle => EBADF,
        TakeError::Refused(e) => e,
    })
}

fn err(e: &io::Error) -> ssize_t {
    -(colo::errno_of(e) as isize)
}

/// Runs `f`, turning a panic into `-EIO`.
fn guard(f: impl FnOnce() -> Result<isize, isize>) -> ssize_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => e,
        Err(_) => -(errno::EIO as isize),
    }
}

fn guard_int(f: impl FnOnce() -> Result<isize, isize>) -> c_int {
    guard(f) as c_int
}

const EINVAL: isize = -(errno::EINVAL as isize);
const EBADF: isize = -(errno::EBADF as isize);

fn parse_addr(addr: *const c_char) -> Result<String, isize> {
    if addr.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: the caller passes a NUL-terminated string (documented); we checked it is not NULL.
    let s = unsafe { CStr::from_ptr(addr) };
    s.to_str().map(str::to_owned).map_err(|_| EINVAL)
}

fn options(opts: *const colo_options) -> Result<Options, isize> {
    let mut o = Options::new();
    if opts.is_null() {
        return Ok(o);
    }
    // SAFETY: a non-NULL `opts` points to a `colo_options` filled by `colo_options_init` (its
    // `size` field tells how much of it the caller's version has; we read only the first field
    // before checking it).
    let size = unsafe { std::ptr::addr_of!((*opts).size).read_unaligned() } as usize;
    if size < std::mem::size_of::<colo_options>() {
        return Err(EINVAL);
    }
    // SAFETY: as above; `size` says the whole struct is there.
    let v = unsafe { opts.read_unaligned() };
    if v.ring_capacity != 0 {
        if !v.ring_capacity.is_power_of_two() || !(4096..=1 << 30).contains(&v.ring_capacity) {
            return Err(EINVAL);
        }
        o = o.ring_capacity(v.ring_capacity);
    }
    if (v.slot_size == 0) != (v.slot_count == 0) || v.slot_size > 1 << 30 || v.slot_count > 65536 {
        return Err(EINVAL);
    }
    o = o.pool(v.slot_size, v.slot_count);
    o = match v.spin_us {
        COLO_SPIN_DEFAULT => o,
        COLO_SPIN_ALWAYS => o.spin(SpinMode::Always),
        0 => o.spin(SpinMode::Never),
        us if us > 0 => o.spin(SpinMode::For(Duration::from_micros(us as u64))),
        _ => return Err(EINVAL),
    };
    if v.connect_timeout_ms != 0 {
        o = o.connect_timeout(Duration::from_millis(v.connect_timeout_ms));
    }
    Ok(o)
}

fn write_addr(a: io::Result<SocketAddr>, buf: *mut c_char, len: usize) -> Result<isize, isize> {
    if buf.is_null() {
        return Err(EINVAL);
    }
    let text = a.map_err(|e| err(&e))?.to_string();
    if text.len() + 1 > len {
        return Err(-(errno::ENOSPC as isize));
    }
    // SAFETY: `buf` has room for `len >= text.len() + 1` bytes (documented contract).
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        *buf.add(text.len()) = 0;
    }
    Ok(text.len() as isize)
}

// ---- library --------------------------------------------------------------------------------------

/// The library version, a static NUL-terminated string such as "0.1.0". Never NULL; not freed.
#[no_mangle]
pub extern "C" fn colo_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Fills `*opts` with the defaults (rings that grow up to tcp_wmem's maximum, 16 x 64 KiB message slots, default spin,
/// 5 s handshake timeout) and sets `opts->size`.
///
/// Returns 0, or -EINVAL if `opts` is NULL.
#[no_mangle]
pub extern "C" fn colo_options_init(opts: *mut colo_options) -> c_int {
    guard_int(|| {
        if opts.is_null() {
            return Err(EINVAL);
        }
        let d = Options::new().geometry();
        let v = colo_options {
            size: std::mem::size_of::<colo_options>() as u32,
            ring_capacity: d.ring_capacity,
            slot_size: d.slot_size,
            slot_count: d.slot_count,
            spin_us: COLO_SPIN_DEFAULT,
            connect_timeout_ms: 200,
        };
        // SAFETY: `opts` is not NULL and points to writable memory for a `colo_options`.
        unsafe { opts.write_unaligned(v) };
        Ok(0)
    })
}

/// Returns a description of an error code (negative or positive errno), as a static
/// NUL-terminated string owned by the library (or, for codes it does not know, a thread-local
/// string valid until the next call on this thread). Never NULL.
#[no_mangle]
pub extern "C" fn colo_strerror(code: c_int) -> *const c_char {
    let Some(code) = code.checked_abs() else {
        return c"Unknown error".as_ptr();
    };
    let known: &'static str = match code {
        0 => "Success\0",
        5 => "Input/output error\0",
        9 => "Bad handle (NULL, closed or released) (EBADF)\0",
        11 => "Resource temporarily unavailable: would block or timed out (EAGAIN)\0",
        12 => "Cannot allocate memory (ENOMEM)\0",
        22 => "Invalid argument (EINVAL)\0",
        28 => "Buffer too small (ENOSPC)\0",
        32 => "Broken pipe: the peer stopped reading or is gone (EPIPE)\0",
        71 => "Protocol error: the peer corrupted the connection (EPROTO)\0",
        90 => "Message too long for a slot of this connection (EMSGSIZE)\0",
        98 => "Address already in use (EADDRINUSE)\0",
        99 => "Cannot assign requested address (EADDRNOTAVAIL)\0",
        104 => "Connection reset by peer (ECONNRESET)\0",
        105 => "No zero-copy pool on this connection (ENOBUFS)\0",
        107 => "Transport endpoint is not connected (ENOTCONN)\0",
        110 => "Connection timed out (ETIMEDOUT)\0",
        111 => "Connection refused (ECONNREFUSED)\0",
        _ => "",
    };
    if !known.is_empty() {
        return known.as_ptr().cast();
    }
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with(|b| {
        let mut b = b.borrow_mut();
        b.clear();
        // `io::Error`'s text without its " (os error N)" suffix, as strerror(3) has it.
        let text = io::Error::from_raw_os_error(code).to_string();
        let text = text.strip_suffix(&format!(" (os error {code})")).unwrap_or(&text);
        b.extend(text.bytes().filter(|&c| c != 0));
        b.push(0);
        b.as_ptr().cast()
    })
}

// ---- listeners ----------------------------------------------------------------------------------

/// Listens on `addr` ("ip:port" text, e.g. "127.0.0.1:7000"; port 0 picks a free port): a TCP
/// listener for any client, plus a shared-memory rendezvous for colo clients on this host.
/// `opts` (may be NULL) sets the geometry of accepted connections. On success stores a new handle
/// in `*out`, which the caller owns and frees with `colo_listener_close`.
///
/// Returns 0, or -EINVAL (NULL `addr`/`out`, text that is not an address, bad `opts`),
/// -EADDRINUSE, -EADDRNOTAVAIL, -EACCES, -EMFILE or another errno from socket calls.
#[no_mangle]
pub extern "C" fn colo_listen(addr: *const c_char, opts: *const colo_options, out: *mut *mut colo_listener) -> c_int {
    guard_int(|| {
        if out.is_null() {
            return Err(EINVAL);
        }
        let a = parse_addr(addr)?;
        let o = options(opts)?;
        let l = Listener::bind_with(a.as_str(), o).map_err(|e| err(&e))?;
        let h = with_cx(|cx| insert(cx, LISTENER, || Obj::Listener(Box::new(l))))?;
        // SAFETY: `out` is not NULL and points to writable storage for one pointer.
        unsafe { *out = h as *mut colo_listener };
        Ok(0)
    })
}

/// Writes the listening address ("ip:port", the actual port) into `buf` (`len` bytes, NUL
/// included; `COLO_ADDRSTRLEN` always suffices).
///
/// Returns the text length (without the NUL), or -EBADF (bad handle), -EINVAL (NULL `buf`),
/// -ENOSPC (`len` too small).
#[no_mangle]
pub extern "C" fn colo_listener_addr(l: *const colo_listener, buf: *mut c_char, len: usize) -> c_int {
    guard_int(|| {
        let l = listener(l)?;
        write_addr(l.local_addr(), buf, len)
    })
}

/// The listener's pollable fd: readable when `colo_accept` may return a connection (use with
/// poll/epoll/select for reading). Owned by the listener: do not close it.
///
/// Returns the fd, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_listener_fileno(l: *const colo_listener) -> c_int {
    guard_int(|| Ok(listener(l)?.as_raw_fd() as isize))
}

/// Non-blocking mode for `colo_accept` (`on` != 0): it returns -EAGAIN instead of waiting.
///
/// Returns 0, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_listener_set_nonblocking(l: *const colo_listener, on: c_int) -> c_int {
    guard_int(|| {
        listener(l)?.set_nonblocking(on != 0).map_err(|e| err(&e))?;
        Ok(0)
    })
}

/// Returns 1 if local clients reach this listener over shared memory, 0 if it serves TCP only
/// (another process holds the rendezvous name), or -EBADF.
#[no_mangle]
pub extern "C" fn colo_listener_is_colo(l: *const colo_listener) -> c_int {
    guard_int(|| Ok(listener(l)?.is_colo() as isize))
}

/// Accepts the next connection (shared memory or TCP), waiting for one unless the listener is
/// non-blocking. `flags`: 0 or `COLO_NONBLOCK` (the new connection starts non-blocking). Stores a
/// new connection handle in `*out` (the caller owns it: `colo_close`). If `peer` is not NULL, the
/// peer's address text is written there (`peer_len` bytes; `COLO_ADDRSTRLEN` suffices; truncated
/// addresses are not written, the connection is still returned).
///
/// Returns 0, or -EBADF (bad listener), -EINVAL (NULL `out`, unknown flags), -EAGAIN
/// (non-blocking and no connection pending), -EMFILE or another errno from socket calls.
#[no_mangle]
pub extern "C" fn colo_accept(
    l: *const colo_listener,
    flags: c_int,
    out: *mut *mut colo_conn,
    peer: *mut c_char,
    peer_len: usize,
) -> c_int {
    guard_int(|| {
        let l = listener(l)?;
        if out.is_null() || flags & !COLO_NONBLOCK != 0 {
            return Err(EINVAL);
        }
        let (s, addr) = l.accept().map_err(|e| err(&e))?;
        if flags & COLO_NONBLOCK != 0 {
            s.set_nonblocking(true).map_err(|e| err(&e))?;
        }
        if !peer.is_null() {
            let _ = write_addr(Ok(addr), peer, peer_len);
        }
        let h = with_cx(|cx| insert(cx, CONN, || Obj::Conn(s)))?;
        // SAFETY: `out` is not NULL and points to writable storage for one pointer.
        unsafe { *out = h as *mut colo_conn };
        Ok(0)
    })
}

/// Stops listening and frees the handle. A thread blocked in `colo_accept` on it finishes that
/// call first. Connections already accepted are not affected.
///
/// Returns 0, or -EBADF (NULL, already closed, or not a listener).
#[no_mangle]
pub extern "C" fn colo_listener_close(l: *mut colo_listener) -> c_int {
    guard_int(|| {
        // The listener is dropped with the last reference: here, or when a blocked `colo_accept`
        // returns.
        let (owner, _) = TABLE.close(l as usize, LISTENER).ok_or(EBADF)?;
        drop(owner);
        Ok(0)
    })
}

// ---- connections --------------------------------------------------------------------------------

/// Connects to `addr` ("ip:port"): over shared memory when a colo listener serves it on this
/// host, else over plain TCP (remote hosts, non-colo servers). `opts` (may be NULL) sets ring and
/// pool sizes. On success stores a new handle in `*out`; the caller owns it (`colo_close`).
///
/// Returns 0, or -EINVAL (NULL `addr`/`out`, bad text or `opts`), -ECONNREFUSED (nobody listens),
/// -ETIMEDOUT, -ENETUNREACH or another errno from `connect(2)`.
#[no_mangle]
pub extern "C" fn colo_connect(addr: *const c_char, opts: *const colo_options, out: *mut *mut colo_conn) -> c_int {
    guard_int(|| {
        if out.is_null() {
            return Err(EINVAL);
        }
        let a = parse_addr(addr)?;
        let o = options(opts)?;
        let s = Stream::connect_with(a.as_str(), &o).map_err(|e| err(&e))?;
        let h = with_cx(|cx| insert(cx, CONN, || Obj::Conn(s)))?;
        // SAFETY: `out` is not NULL and points to writable storage for one pointer.
        unsafe { *out = h as *mut colo_conn };
        Ok(0)
    })
}

fn checked_buf(buf: *const c_void, len: usize) -> Result<(), isize> {
    if len > isize::MAX as usize || (buf.is_null() && len > 0) {
        return Err(EINVAL);
    }
    Ok(())
}

/// Runs `op` on the connection and the caller's `len` writable bytes at `buf` (a read); a zero
/// length returns 0 without calling it.
fn with_out_buf(
    c: *const colo_conn,
    buf: *mut c_void,
    len: usize,
    op: impl FnOnce(&Stream, &mut [u8]) -> std::io::Result<usize>,
) -> Result<isize, isize> {
    with_cx(|cx| {
        let s = conn_in(cx, c)?;
        checked_buf(buf, len)?;
        if len == 0 {
            return Ok(0);
        }
        // SAFETY: `buf` is not NULL and the caller provides `len` writable bytes.
        let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        let r = op(&s, b);
        cx.put(s.0);
        r.map(|n| n as isize).map_err(|e| err(&e))
    })
}

/// Runs `op` on the connection and the caller's `len` readable bytes at `buf` (a write); a zero
/// length returns 0 without calling it.
fn with_in_buf(
    c: *const colo_conn,
    buf: *const c_void,
    len: usize,
    op: impl FnOnce(&Stream, &[u8]) -> std::io::Result<usize>,
) -> Result<isize, isize> {
    with_cx(|cx| {
        let s = conn_in(cx, c)?;
        checked_buf(buf, len)?;
        if len == 0 {
            return Ok(0);
        }
        // SAFETY: `buf` is not NULL and the caller provides `len` readable bytes.
        let b = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
        let r = op(&s, b);
        cx.put(s.0);
        r.map(|n| n as isize).map_err(|e| err(&e))
    })
}

/// Reads up to `len` bytes into `buf`, waiting until at least one byte is there (unless
/// non-blocking or a read timeout expires).
///
/// Returns the number of bytes read, 0 at end of stream (the peer shut down writing or closed;
/// also after `colo_shutdown(COLO_SHUT_RD)`, and when `len` is 0), or -EBADF (bad handle),
/// -EINVAL (NULL `buf` with `len` > 0), -EAGAIN (non-blocking and nothing to read, or the read
/// timeout expired), -ECONNRESET (the peer reset or died), -EPROTO (the peer corrupted the
/// shared memory).
#[no_mangle]
pub extern "C" fn colo_read(c: *const colo_conn, buf: *mut c_void, len: usize) -> ssize_t {
    guard(|| with_out_buf(c, buf, len, |s, b| (&*s).read(b)))
}

/// Like `colo_read` but leaves the bytes to be read again (`MSG_PEEK`). Same returns.
#[no_mangle]
pub extern "C" fn colo_peek(c: *const colo_conn, buf: *mut c_void, len: usize) -> ssize_t {
    guard(|| with_out_buf(c, buf, len, |s, b| s.peek(b)))
}

/// Writes up to `len` bytes from `buf`, waiting only while no byte can be written.
///
/// Returns the number of bytes written (at least 1 if `len` > 0), or -EBADF, -EINVAL (NULL `buf`
/// with `len` > 0), -EAGAIN (non-blocking and no space, or the write timeout expired), -EPIPE
/// (we shut down writing, or the peer stopped reading, closed or died), -ECONNRESET, -EPROTO.
/// No signal is raised.
#[no_mangle]
pub extern "C" fn colo_write(c: *const colo_conn, buf: *const c_void, len: usize) -> ssize_t {
    guard(|| with_in_buf(c, buf, len, |s, b| (&*s).write(b)))
}

/// Writes all `len` bytes, waiting for space as needed.
///
/// Returns 0, or the errors of `colo_write` (after an error some bytes may have been written).
#[no_mangle]
pub extern "C" fn colo_write_all(c: *const colo_conn, buf: *const c_void, len: usize) -> c_int {
    guard_int(|| with_in_buf(c, buf, len, |s, b| (&*s).write_all(b).map(|()| 0)))
}

/// Shuts down reading (`COLO_SHUT_RD`), writing (`COLO_SHUT_WR`: the peer reads end of stream
/// after our last byte) or both (`COLO_SHUT_RDWR`), with TCP's meaning. The handle stays valid.
///
/// Returns 0, or -EBADF, -EINVAL (bad `how`), -ENOTCONN (TCP: already gone).
#[no_mangle]
pub extern "C" fn colo_shutdown(c: *const colo_conn, how: c_int) -> c_int {
    guard_int(|| {
        let s = conn(c)?;
        let how = match how {
            COLO_SHUT_RD => Shutdown::Read,
            COLO_SHUT_WR => Shutdown::Write,
            COLO_SHUT_RDWR => Shutdown::Both,
            _ => return Err(EINVAL),
        };
        s.shutdown(how).map(|()| 0).map_err(|e| err(&e))
    })
}

/// Closes the connection and frees the handle: the peer reads our remaining bytes, then end of
/// stream. Messages and loans of this connection stay valid (and keep its shared memory mapped)
/// until released, sent or cancelled. Another thread blocked on the connection finishes its call
/// first (over shared memory it may wait for the peer). Another thread that used the connection
/// may keep its memory and descriptors until that thread's next call on a connection (or its
/// exit); the peer sees the close at once.
///
/// Returns 0, or -EBADF (NULL, already closed, or not a connection).
#[no_mangle]
pub extern "C" fn colo_close(c: *mut colo_conn) -> c_int {
    guard_int(|| {
        let (owner, shared) = TABLE.close(c as usize, CONN).ok_or(EBADF)?;
        let s = ConnRef(owner);
        if shared {
            // Someone still holds it (a message, a loan, a blocked call): make the close visible now.
            let _ = s.shutdown(Shutdown::Both);
        }
        // The stream is dropped with the last reference: here, or when the last message or loan is
        // released or a blocked call returns.
        drop(s);
        Ok(0)
    })
}

/// The connection's pollable readiness fd, for poll/epoll/select *for reading*: it becomes
/// readable when the peer made progress (data, space, a message, a release, a close) or died.
/// Over TCP it is the socket itself. Readiness is a hint: retry the non-blocking call, which may
/// still return -EAGAIN. Owned by the connection: do not close or read it.
///
/// Returns the fd, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_fileno(c: *const colo_conn) -> c_int {
    guard_int(|| Ok(conn(c)?.as_raw_fd() as isize))
}

/// Non-blocking mode (`on` != 0): calls that would wait return -EAGAIN instead.
///
/// Returns 0, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_set_nonblocking(c: *const colo_conn, on: c_int) -> c_int {
    guard_int(|| conn(c)?.set_nonblocking(on != 0).map(|()| 0).map_err(|e| err(&e)))
}

fn timeout(us: u64) -> Option<Duration> {
    (us > 0).then(|| Duration::from_micros(us))
}

/// Read timeout in microseconds (0: wait forever): a read, peek or `colo_recv_message` waiting
/// longer returns -EAGAIN.
///
/// Returns 0, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_set_read_timeout(c: *const colo_conn, timeout_us: u64) -> c_int {
    guard_int(|| conn(c)?.set_read_timeout(timeout(timeout_us)).map(|()| 0).map_err(|e| err(&e)))
}

/// Write timeout in microseconds (0: wait forever): a write or `colo_loan` waiting longer returns
/// -EAGAIN.
///
/// Returns 0, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_set_write_timeout(c: *const colo_conn, timeout_us: u64) -> c_int {
    guard_int(|| conn(c)?.set_write_timeout(timeout(timeout_us)).map(|()| 0).map_err(|e| err(&e)))
}

/// How the connection moves bytes.
///
/// Returns `COLO_TRANSPORT_SHM`, `COLO_TRANSPORT_TCP`, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_transport(c: *const colo_conn) -> c_int {
    guard_int(|| {
        Ok(match conn(c)?.transport() {
            Transport::SharedMemory => COLO_TRANSPORT_SHM,
            Transport::Tcp => COLO_TRANSPORT_TCP,
        } as isize)
    })
}

/// Writes the peer's address ("ip:port") into `buf` (`len` bytes including the NUL;
/// `COLO_ADDRSTRLEN` suffices). Over shared memory a client's port is 0 (it has no TCP port).
///
/// Returns the text length, or -EBADF, -EINVAL (NULL `buf`), -ENOSPC (too small), -ENOTCONN.
#[no_mangle]
pub extern "C" fn colo_peer_addr(c: *const colo_conn, buf: *mut c_char, len: usize) -> c_int {
    guard_int(|| write_addr(conn(c)?.peer_addr(), buf, len))
}

/// Writes our address ("ip:port") into `buf`; as `colo_peer_addr`.
#[no_mangle]
pub extern "C" fn colo_local_addr(c: *const colo_conn, buf: *mut c_char, len: usize) -> c_int {
    guard_int(|| write_addr(conn(c)?.local_addr(), buf, len))
}

/// The largest zero-copy message this connection carries: the slot size over shared memory (0
/// if it has no pool), 2^32 - 1 over TCP.
///
/// Returns the size, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_max_message_size(c: *const colo_conn) -> ssize_t {
    guard(|| Ok(conn(c)?.max_message_size() as isize))
}

// ---- zero-copy messages -------------------------------------------------------------------------

/// Loans a buffer of at least `len` bytes for one outgoing message, waiting while every slot of
/// the pool is in flight (unless non-blocking or the write timeout expires). Write the message in
/// place at `*data`, then `colo_send` it (or `colo_loan_cancel`). Over shared memory the buffer
/// is in the segment and the receiver reads these very bytes; over TCP it is a heap buffer framed
/// on the stream. The caller owns the loan; `*data` is valid until it is sent or cancelled.
///
/// Returns 0, or -EBADF, -EINVAL (NULL `out` or `data`), -EMSGSIZE (`len` above
/// `colo_max_message_size`), -ENOBUFS (no pool), -EAGAIN, -EPIPE, -ECONNRESET, -EPROTO.
#[no_mangle]
pub extern "C" fn colo_loan(c: *const colo_conn, len: usize, out: *mut *mut colo_buf, data: *mut *mut c_void) -> c_int {
    guard_int(|| with_cx(|cx| {
        let s = conn_in(cx, c)?;
        if out.is_null() || data.is_null() {
            return Err(EINVAL);
        }
        let loan = s.loan_raw(len).map_err(|e| err(&e))?;
        let ptr = loan.as_mut_ptr();
        // The box keeps `s`'s reference: the stream outlives the loan.
        let h = insert(cx, LOAN, || Obj::Loan(LoanBox { loan, conn: s.0 }))?;
        // SAFETY: `out` and `data` are not NULL and point to writable pointers.
        unsafe {
            *out = h as *mut colo_buf;
            *data = ptr.cast();
        }
        Ok(0)
    }))
}

/// The loan's buffer, or NULL for a bad handle.
#[no_mangle]
pub extern "C" fn colo_loan_data(l: *const colo_buf) -> *mut c_void {
    catch_unwind(|| {
        with(l as usize, LOAN, |o| match o {
            Obj::Loan(b) => b.loan.as_mut_ptr().cast::<c_void>(),
            _ => std::ptr::null_mut(),
        })
        .unwrap_or(std::ptr::null_mut())
    })
    .unwrap_or(std::ptr::null_mut())
}

/// How many bytes the loan's buffer holds (at least the `len` asked for), or -EBADF.
#[no_mangle]
pub extern "C" fn colo_loan_capacity(l: *const colo_buf) -> ssize_t {
    guard(|| {
        with(l as usize, LOAN, |o| match o {
            Obj::Loan(b) => b.loan.capacity() as isize,
            _ => EBADF,
        })
        .ok_or(EBADF)
    })
}

/// Sends the first `len` bytes of the loan as one message. Only a descriptor moves; the receiver
/// reads the buffer in place. The loan handle is consumed (freed) whether or not sending
/// succeeds, except on -EBADF and -EINVAL, which leave it untouched. Over TCP the message is
/// framed on the stream: all of it is sent, or (-EAGAIN) none of it.
///
/// Returns 0, or -EBADF (bad or already sent loan), -EINVAL (`len` above the capacity),
/// -EPIPE (this side shut down writing or closed, or the peer stopped reading or closed),
/// -ECONNRESET, -EPROTO; over TCP also -EAGAIN, -ETIMEDOUT.
#[no_mangle]
pub extern "C" fn colo_send(l: *mut colo_buf, len: usize) -> c_int {
    guard_int(|| with_cx(|cx| {
        let t = take(cx, l as usize, LOAN, |o| match o {
            Obj::Loan(b) if len <= b.loan.capacity() => Ok(()),
            _ => Err(EINVAL),
        })?;
        let (loan, conn) = loan_parts(t);
        // SAFETY: the loan came from `loan_raw` on this connection, its handle is dead now (it is
        // sent once), and `len` fits (checked by the take).
        let r = unsafe { stream_of(&conn).send_raw(loan, len) };
        cx.put(conn);
        r.map(|()| 0).map_err(|e| err(&e))
    }))
}

/// Gives an unsent loan back (its slot returns to the pool) and frees the handle.
///
/// Returns 0, or -EBADF (bad, sent or cancelled loan).
#[no_mangle]
pub extern "C" fn colo_loan_cancel(l: *mut colo_buf) -> c_int {
    guard_int(|| with_cx(|cx| {
        let (loan, conn) = loan_parts(take(cx, l as usize, LOAN, |_| Ok(()))?);
        // SAFETY: as in `colo_send`: this connection's loan, ended once.
        unsafe { stream_of(&conn).cancel_raw(loan) };
        cx.put(conn);
        Ok(0)
    }))
}

/// Receives the next zero-copy message, waiting for one (unless non-blocking or the read timeout
/// expires). On success stores a handle in `*out` and, if not NULL, the message's bytes in
/// `*data` and `*len`: a read-only view in the shared segment (over TCP, a heap copy), valid until
/// `colo_msg_release`. The caller owns the message and must release it: the sender gets the slot
/// back only then.
///
/// Returns 1 (a message), 0 (end of stream: the peer shut down writing or closed, or this side
/// shut down reading; `*out` is set to NULL), or -EBADF, -EINVAL (NULL `out`), -ENOBUFS (no
/// pool), -EAGAIN, -ECONNRESET (the peer reset or died), -EPROTO.
#[no_mangle]
pub extern "C" fn colo_recv_message(
    c: *const colo_conn,
    out: *mut *mut colo_msg,
    data: *mut *const c_void,
    len: *mut usize,
) -> c_int {
    guard_int(|| with_cx(|cx| {
        let s = conn_in(cx, c)?;
        if out.is_null() {
            return Err(EINVAL);
        }
        let Some(msg) = s.recv_raw().map_err(|e| err(&e))? else {
            cx.put(s.0);
            // SAFETY: `out` is not NULL and points to a writable pointer.
            unsafe { *out = std::ptr::null_mut() };
            return Ok(0);
        };
        let (ptr, n) = (msg.as_ptr(), msg.len());
        // The box keeps `s`'s reference: the stream outlives the message.
        let h = insert(cx, MSG, || Obj::Msg(MsgBox { msg, conn: s.0 }))?;
        // SAFETY: `out` is not NULL; `data` and `len` are written only when not NULL.
        unsafe {
            *out = h as *mut colo_msg;
            if !data.is_null() {
                *data = ptr.cast();
            }
            if !len.is_null() {
                *len = n;
            }
        }
        Ok(1)
    }))
}

/// The message's bytes (read-only, valid until released), or NULL for a bad handle.
#[no_mangle]
pub extern "C" fn colo_msg_data(m: *const colo_msg) -> *const c_void {
    catch_unwind(|| {
        with(m as usize, MSG, |o| match o {
            Obj::Msg(b) => b.msg.as_ptr().cast::<c_void>(),
            _ => std::ptr::null(),
        })
        .unwrap_or(std::ptr::null())
    })
    .unwrap_or(std::ptr::null())
}

/// The message's length in bytes, or -EBADF.
#[no_mangle]
pub extern "C" fn colo_msg_len(m: *const colo_msg) -> ssize_t {
    guard(|| {
        with(m as usize, MSG, |o| match o {
            Obj::Msg(b) => b.msg.len() as isize,
            _ => EBADF,
        })
        .ok_or(EBADF)
    })
}

/// Releases a received message: its slot goes back to the sender and the handle and its data
/// pointer become invalid.
///
/// Returns 0, or -EBADF (NULL, already released, or not a message).
#[no_mangle]
pub extern "C" fn colo_msg_release(m: *mut colo_msg) -> c_int {
    guard_int(|| with_cx(|cx| {
        let (msg, conn) = msg_parts(take(cx, m as usize, MSG, |_| Ok(()))?);
        // SAFETY: the message came from `recv_raw` on this connection; its handle is dead now, so
        // it is released once.
        unsafe { stream_of(&conn).release_raw(msg) };
        cx.put(conn);
        Ok(0)
    }))
}

