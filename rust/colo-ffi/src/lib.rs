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

/// The socket addresses `addr` names ("ip:port", or "host:port" resolved here): -EINVAL for
/// NULL, text that is not an address, or a host name that does not resolve (the resolver's
/// answer carries no errno; an errno it does carry is returned as it is).
fn parse_addr(addr: *const c_char) -> Result<Vec<SocketAddr>, isize> {
    use std::net::ToSocketAddrs;
    if addr.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: the caller passes a NUL-terminated string (documented); we checked it is not NULL.
    let s = unsafe { CStr::from_ptr(addr) };
    let text = s.to_str().map_err(|_| EINVAL)?;
    match text.to_socket_addrs() {
        Ok(addrs) => Ok(addrs.collect()),
        Err(e) => Err(e.raw_os_error().map_or(EINVAL, |code| -(code as isize))),
    }
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

// ---- the entry points, one module per section of colo.h -------------------------------------------

// Declared in colo.h's order: cbindgen emits the modules' functions in declaration order.
mod library;

mod listeners;

mod connections;

mod messages;
