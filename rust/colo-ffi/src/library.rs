//! The library itself: its version, the default options, error texts.

use crate::*;

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
