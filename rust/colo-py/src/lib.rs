//! `colo._colo`: the Python extension over the colo Rust API (the `colo` package wraps it).
//!
//! Every call that may wait releases the GIL (`Python::allow_threads`). Errors are `OSError`s
//! with the errno of the failure (so `ConnectionResetError`, `BrokenPipeError`, ...), a timeout is
//! `TimeoutError`, a would-block in non-blocking mode is `BlockingIOError`, and any use of a
//! closed object is `OSError(EBADF)`, as with `socket`. Zero-copy messages are objects exporting
//! the buffer protocol over the shared segment itself: `memoryview(msg)` reads the bytes in place.

use colo::{Listener as CoreListener, Loan as CoreLoan, Message as CoreMessage, Options, SpinMode, Stream, Transport};
use pyo3::exceptions::{PyBlockingIOError, PyBufferError, PyOSError, PyOverflowError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use std::ffi::c_int;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const EBADF: i32 = 9;
const EAGAIN: i32 = 11;
const MSG_PEEK: i32 = 2;
/// Never raise SIGPIPE: what colo does anyway, so accepted and ignored.
const MSG_NOSIGNAL: i32 = 0x4000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn os_error(errno: i32, what: &str) -> PyErr {
    PyOSError::new_err((errno, what.to_string()))
}

fn closed() -> PyErr {
    os_error(EBADF, "Bad file descriptor")
}

/// Maps an io::Error: would-block becomes `TimeoutError` when a timeout is set, else
/// `BlockingIOError`; everything else an `OSError` subclass chosen by errno.
fn to_py(e: io::Error, timeout: Option<f64>) -> PyErr {
    let errno = colo::errno_of(&e);
    if errno == EAGAIN {
        return match timeout {
            Some(t) if t > 0.0 => PyTimeoutError::new_err("timed out"),
            _ => PyBlockingIOError::new_err((EAGAIN, "Resource temporarily unavailable")),
        };
    }
    let text = io::Error::from_raw_os_error(errno).to_string();
    let text = text.split(" (os error").next().unwrap_or(&text).to_string();
    PyOSError::new_err((errno, text))
}

/// "host:port" text or a `(host, port)` tuple (IPv6: `("::1", port)`).
fn parse_addr(addr: &Bound<'_, PyAny>) -> PyResult<Vec<SocketAddr>> {
    let text = if let Ok(s) = addr.extract::<String>() {
        s
    } else if let Ok(t) = addr.downcast::<PyTuple>() {
        if t.len() < 2 {
            return Err(PyTypeError::new_err("address must be 'host:port' or (host, port)"));
        }
        let host: String = t.get_item(0)?.extract()?;
        let port: u16 = t.get_item(1)?.extract().map_err(|_| PyOverflowError::new_err("port must be 0-65535."))?;
        let host = if host.is_empty() { "0.0.0.0".to_string() } else { host };
        if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    } else {
        return Err(PyTypeError::new_err("address must be 'host:port' or (host, port)"));
    };
    let py = addr.py();
    let found: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| match e.raw_os_error() {
            Some(_) => to_py(e, None),
            None => gaierror(py, format!("cannot resolve {text:?}: {e}")),
        })?
        .collect();
    if found.is_empty() {
        return Err(gaierror(py, format!("no address for {text:?}")));
    }
    Ok(found)
}

/// `socket.gaierror(EAI_NONAME, msg)`, as `socket` raises for an address it cannot resolve.
fn gaierror(py: Python<'_>, msg: String) -> PyErr {
    const EAI_NONAME: i32 = -2;
    match py.import("socket").and_then(|m| m.getattr("gaierror")?.call1((EAI_NONAME, msg))) {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}

fn addr_tuple(py: Python<'_>, a: SocketAddr) -> PyResult<Py<PyAny>> {
    Ok((a.ip().to_string(), a.port()).into_pyobject(py)?.into_any().unbind())
}

fn options(ring_capacity: Option<u32>, slot_size: Option<u32>, slot_count: Option<u32>, spin_us: Option<i64>) -> PyResult<Options> {
    let mut o = Options::new();
    if let Some(r) = ring_capacity {
        if !r.is_power_of_two() || !(4096..=1 << 30).contains(&r) {
            return Err(PyValueError::new_err("ring_capacity must be a power of two from 4096 to 2**30"));
        }
        o = o.ring_capacity(r);
    }
    if slot_size.is_some() || slot_count.is_some() {
        let g = o.geometry();
        let (s, n) = (slot_size.unwrap_or(g.slot_size), slot_count.unwrap_or(g.slot_count));
        if (s == 0) != (n == 0) || n > 65536 || s > 1 << 30 {
            return Err(PyValueError::new_err("slot_size and slot_count must both be 0 or both positive (count <= 65536)"));
        }
        o = o.pool(s, n);
    }
    match spin_us {
        None => {}
        Some(-1) => o = o.spin(SpinMode::Always),
        Some(0) => o = o.spin(SpinMode::Never),
        Some(us) if us > 0 => o = o.spin(SpinMode::For(Duration::from_micros(us as u64))),
        Some(_) => return Err(PyValueError::new_err("spin_us must be -1 (always), 0 (never) or microseconds")),
    }
    Ok(o)
}

mod conn;
mod listener;
mod message;
use conn::{connect, Conn};
use listener::{listen, Listener};
use message::{Loan, Message};

#[pymodule]
fn _colo(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Listener>()?;
    m.add_class::<Conn>()?;
    m.add_class::<Loan>()?;
    m.add_class::<Message>()?;
    m.add_function(wrap_pyfunction!(listen, m)?)?;
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
