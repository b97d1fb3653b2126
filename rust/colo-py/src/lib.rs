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

// ---- Listener --------------------------------------------------------------------------------------

/// A listening colo endpoint: TCP for any client plus shared memory for colo clients on this host.
#[pyclass(module = "colo._colo")]
pub struct Listener {
    inner: Mutex<Option<Arc<CoreListener>>>,
}

impl Listener {
    fn get(&self) -> PyResult<Arc<CoreListener>> {
        lock(&self.inner).clone().ok_or_else(closed)
    }
}

#[pymethods]
impl Listener {
    /// Waits for a connection (GIL released); returns `(Conn, (host, port))`.
    fn accept(&self, py: Python<'_>) -> PyResult<(Conn, Py<PyAny>)> {
        let l = self.get()?;
        let (s, a) = py.allow_threads(|| l.accept()).map_err(|e| to_py(e, None))?;
        Ok((Conn::new(s), addr_tuple(py, a)?))
    }

    /// Non-blocking accept (`BlockingIOError` when nothing is pending) or blocking.
    fn setblocking(&self, flag: bool) -> PyResult<()> {
        self.get()?.set_nonblocking(!flag).map_err(|e| to_py(e, None))
    }

    /// Readable when `accept` may return a connection (for select/poll/asyncio); -1 once closed.
    fn fileno(&self) -> i32 {
        lock(&self.inner).as_ref().map_or(-1, |l| l.as_raw_fd())
    }

    /// The listening `(host, port)`.
    fn getsockname(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        addr_tuple(py, self.get()?.local_addr().map_err(|e| to_py(e, None))?)
    }

    /// The listening address as "host:port" text.
    #[getter]
    fn address(&self) -> PyResult<String> {
        Ok(self.get()?.local_addr().map_err(|e| to_py(e, None))?.to_string())
    }

    /// Whether local clients reach this listener over shared memory.
    #[getter]
    fn is_colo(&self) -> PyResult<bool> {
        Ok(self.get()?.is_colo())
    }

    /// Stops listening (idempotent).
    fn close(&self) {
        lock(&self.inner).take();
    }

    #[getter]
    fn closed(&self) -> bool {
        lock(&self.inner).is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, _t: Option<Bound<'_, PyAny>>, _v: Option<Bound<'_, PyAny>>, _tb: Option<Bound<'_, PyAny>>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        match lock(&self.inner).as_ref() {
            Some(l) => format!("<colo.Listener {}>", l.local_addr().map(|a| a.to_string()).unwrap_or_default()),
            None => "<colo.Listener closed>".to_string(),
        }
    }
}

/// Listens on `addr` ("host:port" or `(host, port)`; port 0 picks one).
#[pyfunction]
#[pyo3(signature = (addr, *, ring_capacity=None, slot_size=None, slot_count=None, spin_us=None))]
fn listen(
    py: Python<'_>,
    addr: &Bound<'_, PyAny>,
    ring_capacity: Option<u32>,
    slot_size: Option<u32>,
    slot_count: Option<u32>,
    spin_us: Option<i64>,
) -> PyResult<Listener> {
    let addrs = parse_addr(addr)?;
    let o = options(ring_capacity, slot_size, slot_count, spin_us)?;
    let l = py.allow_threads(|| CoreListener::bind_with(&addrs[..], o)).map_err(|e| to_py(e, None))?;
    Ok(Listener { inner: Mutex::new(Some(Arc::new(l))) })
}

// ---- Conn ----------------------------------------------------------------------------------------

/// A connection over shared memory or TCP, with the methods of a `socket.socket`.
#[pyclass(module = "colo._colo")]
pub struct Conn {
    inner: Mutex<Option<Arc<Stream>>>,
    /// `socket` semantics: None blocking, 0.0 non-blocking, > 0 seconds.
    timeout: Mutex<Option<f64>>,
    /// Open `makefile` objects, and whether `close` was called meanwhile: as with `socket`, the
    /// connection closes when both the object and its files are closed.
    files: Mutex<(usize, bool)>,
}

/// A raw buffer handed to a GIL-free closure; the owner keeps it alive and exported meanwhile.
struct RawBuf(*mut u8, usize);
// SAFETY: the memory belongs to a Python object (a buffer export or a fresh bytes object) that
// the calling frame keeps alive, and no other Rust code touches it while the closure runs.
unsafe impl Send for RawBuf {}

impl Conn {
    fn new(s: Stream) -> Conn {
        Conn { inner: Mutex::new(Some(Arc::new(s))), timeout: Mutex::new(None), files: Mutex::new((0, false)) }
    }

    fn get(&self) -> PyResult<Arc<Stream>> {
        lock(&self.inner).clone().ok_or_else(closed)
    }

    fn err(&self, e: io::Error) -> PyErr {
        to_py(e, *lock(&self.timeout))
    }

    /// Runs `op` with the GIL released. In blocking mode (with or without a timeout) the wait is
    /// cut into slices of at most `SLICE`, and between slices pending signals are handled (so
    /// Ctrl-C interrupts a blocked call, as with `socket`) and the deadline is checked.
    fn blocking<T: Send>(&self, py: Python<'_>, s: &Arc<Stream>, op: impl FnMut(&Stream) -> io::Result<T> + Send) -> PyResult<T> {
        self.blocking_until(py, s, self.deadline(), op)
    }

    /// When a call starting now times out: `Some(None)` never, `None` non-blocking.
    fn deadline(&self) -> Option<Option<Instant>> {
        match *lock(&self.timeout) {
            Some(0.0) => None,
            t => Some(t.and_then(|t| Instant::now().checked_add(Duration::from_secs_f64(t)))),
        }
    }

    /// [`Conn::blocking`] against a deadline taken earlier (`sendall`: one for the whole call).
    fn blocking_until<T: Send>(
        &self,
        py: Python<'_>,
        s: &Arc<Stream>,
        deadline: Option<Option<Instant>>,
        mut op: impl FnMut(&Stream) -> io::Result<T> + Send,
    ) -> PyResult<T> {
        let Some(deadline) = deadline else {
            return py.allow_threads(|| op(s)).map_err(|e| self.err(e));
        };
        loop {
            let slice = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
                None => SLICE,
            }
            .max(Duration::from_micros(1));
            let _ = s.set_read_timeout(Some(slice));
            let _ = s.set_write_timeout(Some(slice));
            match py.allow_threads(|| op(s)) {
                Err(e) if colo::errno_of(&e) == EAGAIN => {
                    py.check_signals()?;
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(PyTimeoutError::new_err("timed out"));
                    }
                }
                r => return r.map_err(|e| self.err(e)),
            }
        }
    }
}

fn send_flags(flags: i32) -> PyResult<()> {
    if flags & !MSG_NOSIGNAL != 0 {
        return Err(PyValueError::new_err("unsupported flags (0 or MSG_NOSIGNAL)"));
    }
    Ok(())
}

/// A timeout in seconds as a `Duration`; `OverflowError` above what `socket` accepts (2^63 ns).
fn timeout_duration(t: f64) -> PyResult<Duration> {
    const MAX_SECS: f64 = 9_223_372_036.0;
    if t > MAX_SECS {
        return Err(PyOverflowError::new_err("timeout doesn't fit into C timeval"));
    }
    Ok(Duration::from_secs_f64(t))
}

/// The longest a blocking call waits without looking at signals.
const SLICE: Duration = Duration::from_millis(100);

/// A contiguous byte view of any object with the buffer protocol (of any item format, as
/// `socket` takes them: `array`, numpy arrays, cast memoryviews), held for the call.
struct ByteBuffer(ffi::Py_buffer);

impl ByteBuffer {
    /// Never NULL (an empty export may have no buffer): slices are made from it.
    fn buf_ptr(&self) -> *mut u8 {
        if self.0.buf.is_null() {
            std::ptr::NonNull::dangling().as_ptr()
        } else {
            self.0.buf.cast()
        }
    }
    fn len_bytes(&self) -> usize {
        self.0.len as usize
    }
}

impl Drop for ByteBuffer {
    fn drop(&mut self) {
        // SAFETY: `self.0` was filled by a successful `PyObject_GetBuffer` and is released once;
        // every holder of a `ByteBuffer` holds the GIL when it drops it (it is only created and
        // dropped in `#[pymethods]`, outside `allow_threads`).
        unsafe { ffi::PyBuffer_Release(&mut self.0) };
    }
}

fn byte_buffer(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<ByteBuffer> {
    let flags = if writable { ffi::PyBUF_SIMPLE | ffi::PyBUF_WRITABLE } else { ffi::PyBUF_SIMPLE };
    let mut view = std::mem::MaybeUninit::<ffi::Py_buffer>::uninit();
    // SAFETY: `obj` is a live object (we hold the GIL through `Bound`); on success the view is
    // initialised and we own one buffer export, released by `ByteBuffer`'s drop. PyBUF_SIMPLE
    // asks for a C-contiguous run of bytes (exporters that cannot give one fail).
    if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), flags) } != 0 {
        let e = PyErr::fetch(obj.py());
        if writable {
            // As `socket.recv_into` says it (read-only buffers included, which raise BufferError).
            return Err(PyTypeError::new_err("a writable bytes-like object is required"));
        }
        return Err(e);
    }
    // SAFETY: initialised by the successful call above.
    Ok(ByteBuffer(unsafe { view.assume_init() }))
}

#[pymethods]
impl Conn {
    /// Receives up to `bufsize` bytes (`b""` at end of stream). `flags`: 0 or `socket.MSG_PEEK`.
    #[pyo3(signature = (bufsize, flags=0))]
    fn recv<'py>(&self, py: Python<'py>, bufsize: isize, flags: i32) -> PyResult<Bound<'py, PyBytes>> {
        if bufsize < 0 {
            return Err(PyValueError::new_err("negative buffersize in recv"));
        }
        let s = self.get()?;
        let peek = flags & MSG_PEEK != 0;
        if flags & !MSG_PEEK != 0 {
            return Err(PyValueError::new_err("unsupported flags"));
        }
        // SAFETY: creating an uninitialised bytes object of `bufsize` bytes; we own the only
        // reference until it is returned, and fill or shrink it before anyone sees it.
        let raw = unsafe { ffi::PyBytes_FromStringAndSize(std::ptr::null(), bufsize) };
        if raw.is_null() {
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `raw` is a new, non-NULL bytes object; its data holds `bufsize` bytes.
        let data = RawBuf(unsafe { ffi::PyBytes_AsString(raw) }.cast::<u8>(), bufsize as usize);
        let r = self.blocking(py, &s, move |s| {
            let data = &data;
            // SAFETY: `data` is the private storage of `raw`, alive (we hold the reference) and
            // not shared with anyone while the GIL is released.
            let buf = unsafe { std::slice::from_raw_parts_mut(data.0, data.1) };
            if peek {
                s.peek(buf)
            } else {
                (&*s).read(buf)
            }
        });
        let mut raw = raw;
        match r {
            Ok(n) => {
                if (n as isize) < bufsize {
                    // SAFETY: `raw` is a bytes object with a reference count of one (ours), so
                    // it may be resized in place; on failure it is freed and set to NULL.
                    if unsafe { ffi::_PyBytes_Resize(&mut raw, n as isize) } != 0 {
                        return Err(PyErr::fetch(py));
                    }
                }
                // SAFETY: `raw` is a valid, owned bytes object.
                Ok(unsafe { Bound::from_owned_ptr(py, raw) }.downcast_into::<PyBytes>()?)
            }
            Err(e) => {
                // SAFETY: we own the one reference to `raw`.
                unsafe { ffi::Py_DECREF(raw) };
                Err(e)
            }
        }
    }

    /// Receives into a writable buffer; returns the number of bytes (0 at end of stream).
    #[pyo3(signature = (buffer, nbytes=0, flags=0))]
    fn recv_into(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, nbytes: isize, flags: i32) -> PyResult<usize> {
        let s = self.get()?;
        if nbytes < 0 {
            return Err(PyValueError::new_err("negative buffersize in recv_into"));
        }
        let b = byte_buffer(buffer, true)?;
        let len = if nbytes == 0 { b.len_bytes() } else { nbytes as usize };
        if len > b.len_bytes() {
            return Err(PyValueError::new_err("buffer too small for requested bytes"));
        }
        let peek = flags & MSG_PEEK != 0;
        let data = RawBuf(b.buf_ptr().cast::<u8>(), len);
        let r = self.blocking(py, &s, move |s| {
            let data = &data;
            // SAFETY: the buffer export `b` keeps the memory alive and un-resizable until it is
            // dropped after this call; `len` is within it.
            let buf = unsafe { std::slice::from_raw_parts_mut(data.0, data.1) };
            if peek {
                s.peek(buf)
            } else {
                (&*s).read(buf)
            }
        });
        drop(b);
        r
    }

    /// Sends some bytes from a bytes-like object; returns how many. `flags`: 0 or
    /// `socket.MSG_NOSIGNAL` (colo never raises SIGPIPE).
    #[pyo3(signature = (data, flags=0))]
    fn send(&self, py: Python<'_>, data: &Bound<'_, PyAny>, flags: i32) -> PyResult<usize> {
        send_flags(flags)?;
        let s = self.get()?;
        let b = byte_buffer(data, false)?;
        let raw = RawBuf(b.buf_ptr().cast::<u8>(), b.len_bytes());
        let r = self.blocking(py, &s, move |s| {
            let raw = &raw;
            // SAFETY: the export `b` keeps the bytes alive until after this call.
            let buf = unsafe { std::slice::from_raw_parts(raw.0, raw.1) };
            (&*s).write(buf)
        });
        drop(b);
        r
    }

    /// Sends all bytes of a bytes-like object. `flags` as for `send`.
    #[pyo3(signature = (data, flags=0))]
    fn sendall(&self, py: Python<'_>, data: &Bound<'_, PyAny>, flags: i32) -> PyResult<()> {
        send_flags(flags)?;
        let s = self.get()?;
        let b = byte_buffer(data, false)?;
        let mut done = 0;
        // As `socket.sendall`: the timeout bounds the whole call, not each piece.
        let deadline = self.deadline();
        while done < b.len_bytes() {
            let raw = RawBuf(b.buf_ptr().cast::<u8>().wrapping_add(done), b.len_bytes() - done);
            done += self.blocking_until(py, &s, deadline, move |s| {
                let raw = &raw;
                // SAFETY: the export `b` keeps the bytes alive until after this call; `raw`
                // covers the unsent rest of it.
                let buf = unsafe { std::slice::from_raw_parts(raw.0, raw.1) };
                (&*s).write(buf)
            })?;
        }
        drop(b);
        Ok(())
    }

    /// `socket.SHUT_RD` (0), `SHUT_WR` (1) or `SHUT_RDWR` (2).
    fn shutdown(&self, how: i32) -> PyResult<()> {
        let how = match how {
            0 => Shutdown::Read,
            1 => Shutdown::Write,
            2 => Shutdown::Both,
            _ => return Err(PyValueError::new_err("how must be SHUT_RD, SHUT_WR or SHUT_RDWR")),
        };
        self.get()?.shutdown(how).map_err(|e| self.err(e))
    }

    /// Closes the connection (idempotent). Messages and loans still held stay valid.
    fn close(&self) {
        {
            let mut files = lock(&self.files);
            if files.0 > 0 {
                files.1 = true;
                return;
            }
        }
        if let Some(s) = lock(&self.inner).take() {
            if Arc::strong_count(&s) > 1 {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    /// A `makefile` object was opened on this connection (`colo._io`).
    fn _io_ref(&self) {
        lock(&self.files).0 += 1;
    }

    /// A `makefile` object was closed: the last one completes a `close` called before it.
    fn _io_unref(&self) {
        let close = {
            let mut files = lock(&self.files);
            files.0 = files.0.saturating_sub(1);
            files.0 == 0 && std::mem::take(&mut files.1)
        };
        if close {
            self.close();
        }
    }

    #[getter]
    fn closed(&self) -> bool {
        lock(&self.inner).is_none()
    }

    /// `None` blocks, `0.0` is non-blocking, a positive number of seconds bounds each call.
    fn settimeout(&self, value: Option<f64>) -> PyResult<()> {
        let s = self.get()?;
        match value {
            Some(t) if t < 0.0 || t.is_nan() => return Err(PyValueError::new_err("Timeout value out of range")),
            Some(0.0) => {
                s.set_nonblocking(true).map_err(|e| self.err(e))?;
            }
            Some(t) => {
                timeout_duration(t)?;
                // The deadline is kept here; `blocking` waits in slices up to it.
                s.set_nonblocking(false).map_err(|e| self.err(e))?;
            }
            None => {
                s.set_nonblocking(false).map_err(|e| self.err(e))?;
            }
        }
        *lock(&self.timeout) = value;
        Ok(())
    }

    fn gettimeout(&self) -> Option<f64> {
        *lock(&self.timeout)
    }

    /// `setblocking(False)` is `settimeout(0.0)`, `setblocking(True)` is `settimeout(None)`.
    fn setblocking(&self, flag: bool) -> PyResult<()> {
        self.settimeout(if flag { None } else { Some(0.0) })
    }

    /// The readiness fd, for select/poll/asyncio *reading* interest: readable when the peer made
    /// progress (data, space, a message, a close). Over TCP, the socket. -1 once closed.
    fn fileno(&self) -> i32 {
        lock(&self.inner).as_ref().map_or(-1, |s| s.as_raw_fd())
    }

    /// Whether a non-blocking call drained a wake-up meant for another waiter since the last
    /// time this was asked (the asyncio layer then retries its other waiters). False over TCP.
    fn take_swallowed(&self) -> PyResult<bool> {
        Ok(self.get()?.take_swallowed())
    }

    /// "colo" (shared memory) or "tcp".
    #[getter]
    fn transport(&self) -> PyResult<&'static str> {
        Ok(match self.get()?.transport() {
            Transport::SharedMemory => "colo",
            Transport::Tcp => "tcp",
        })
    }

    fn getpeername(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let a = self.get()?.peer_addr().map_err(|e| self.err(e))?;
        addr_tuple(py, a)
    }

    fn getsockname(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let a = self.get()?.local_addr().map_err(|e| self.err(e))?;
        addr_tuple(py, a)
    }

    /// The largest zero-copy message this connection carries.
    #[getter]
    fn max_message_size(&self) -> PyResult<usize> {
        Ok(self.get()?.max_message_size())
    }

    /// Loans a writable buffer of `size` bytes in the shared segment for one message; fill it
    /// through `memoryview(loan)`, then `loan.send()`. Waits (GIL released) for a free slot.
    fn loan(&self, py: Python<'_>, size: usize) -> PyResult<Loan> {
        let s = self.get()?;
        let r = self.blocking(py, &s, move |s2| {
            s2.loan(size).map(|l| {
                // SAFETY: the loan borrows the `Stream` in the `Arc` that `LoanState` keeps
                // (field `_conn`, dropped after `loan`), so the borrow outlives its use.
                SendLoan(unsafe { std::mem::transmute::<CoreLoan<'_>, CoreLoan<'static>>(l) })
            })
        });
        let SendLoan(mut loan) = r?;
        let cap = loan.capacity();
        loan.set_len(cap);
        let ptr = loan.as_mut_ptr();
        let zero_copy = loan.is_zero_copy();
        Ok(Loan {
            state: Mutex::new(Some(LoanState { loan, _conn: s, timeout: *lock(&self.timeout) })),
            ptr: RawPtr(ptr),
            len: size,
            cap,
            zero_copy,
            exports: Mutex::new(0),
        })
    }

    /// Receives the next zero-copy message (GIL released while waiting); `None` at end of
    /// stream. The message's bytes stay in the shared segment: `memoryview(msg)` reads them in
    /// place; `msg.release()` (or the end of a `with` block) gives the slot back to the sender.
    fn recv_message(&self, py: Python<'_>) -> PyResult<Option<Message>> {
        let s = self.get()?;
        let r = self.blocking(py, &s, move |s2| {
            s2.recv_message().map(|m| {
                m.map(|m| {
                    // SAFETY: as in `loan`: `MsgState` keeps the borrowed `Stream` alive.
                    SendMsg(unsafe { std::mem::transmute::<CoreMessage<'_>, CoreMessage<'static>>(m) })
                })
            })
        });
        let Some(SendMsg(msg)) = r? else {
            return Ok(None);
        };
        let (ptr, len, zero_copy) = (msg.as_ptr(), msg.len(), msg.is_zero_copy());
        Ok(Some(Message {
            state: Mutex::new(Some(MsgState { msg, _conn: s })),
            ptr: RawPtr(ptr.cast_mut()),
            len,
            zero_copy,
            exports: Mutex::new(0),
        }))
    }

    /// Delegates to `colo._io.makefile` (the same layering as `socket.makefile`).
    #[pyo3(signature = (mode="r", buffering=None, *, encoding=None, errors=None, newline=None))]
    fn makefile<'py>(
        slf: Bound<'py, Self>,
        mode: &str,
        buffering: Option<isize>,
        encoding: Option<&str>,
        errors: Option<&str>,
        newline: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("colo._io")?.getattr("makefile")?.call1((slf, mode, buffering, encoding, errors, newline))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, _t: Option<Bound<'_, PyAny>>, _v: Option<Bound<'_, PyAny>>, _tb: Option<Bound<'_, PyAny>>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        match lock(&self.inner).as_ref() {
            Some(s) => format!(
                "<colo.Conn {} local={} peer={}>",
                s.transport(),
                s.local_addr().map(|a| a.to_string()).unwrap_or_default(),
                s.peer_addr().map(|a| a.to_string()).unwrap_or_default()
            ),
            None => "<colo.Conn closed>".to_string(),
        }
    }
}

/// Connects to `addr`: shared memory when a colo listener serves it on this host, else TCP.
/// `timeout` (seconds) becomes the connection's timeout, as with `socket.create_connection`.
#[pyfunction]
#[pyo3(signature = (addr, timeout=None, *, ring_capacity=None, slot_size=None, slot_count=None, spin_us=None))]
fn connect(
    py: Python<'_>,
    addr: &Bound<'_, PyAny>,
    timeout: Option<f64>,
    ring_capacity: Option<u32>,
    slot_size: Option<u32>,
    slot_count: Option<u32>,
    spin_us: Option<i64>,
) -> PyResult<Conn> {
    let addrs = parse_addr(addr)?;
    let mut o = options(ring_capacity, slot_size, slot_count, spin_us)?;
    if let Some(t) = timeout {
        // Checked before connecting, as `settimeout` below would check it after.
        if t < 0.0 || t.is_nan() {
            return Err(PyValueError::new_err("Timeout value out of range"));
        }
        timeout_duration(t)?;
    }
    if let Some(t) = timeout.filter(|&t| t > 0.0) {
        // As `socket.create_connection`: the timeout bounds the connect too.
        o = o.tcp_connect_timeout(timeout_duration(t)?);
    }
    let s = py.allow_threads(|| Stream::connect_with(&addrs[..], &o)).map_err(|e| to_py(e, timeout))?;
    let c = Conn::new(s);
    if timeout.is_some() {
        c.settimeout(timeout)?;
    }
    Ok(c)
}

// ---- messages and loans ------------------------------------------------------------------------

struct RawPtr(*mut u8);
// SAFETY: the pointer is into memory owned by the object's state (the segment, kept mapped by
// `_conn`, or a heap buffer inside the loan/message); it is only dereferenced by Python through
// a buffer export, which the object tracks, and never after the state is dropped.
unsafe impl Send for RawPtr {}
// SAFETY: as above; the pointer value itself is immutable.
unsafe impl Sync for RawPtr {}

struct SendLoan(CoreLoan<'static>);
// SAFETY: a loan is used by one thread at a time (behind a mutex); its pointer is into memory
// kept alive by the `Arc<Stream>` stored next to it.
unsafe impl Send for SendLoan {}
struct SendMsg(CoreMessage<'static>);
// SAFETY: as for `SendLoan`.
unsafe impl Send for SendMsg {}

/// Field order: the loan/message drops (returning its slot) before the connection.
struct LoanState {
    loan: CoreLoan<'static>,
    _conn: Arc<Stream>,
    /// The connection's timeout when the loan was taken (it bounds the send over TCP).
    timeout: Option<f64>,
}
// SAFETY: see `SendLoan`; the state lives behind a mutex.
unsafe impl Send for LoanState {}

struct MsgState {
    msg: CoreMessage<'static>,
    _conn: Arc<Stream>,
}
// SAFETY: see `SendLoan`; the state lives behind a mutex.
unsafe impl Send for MsgState {}

/// Fills a `Py_buffer` for `len` bytes at `ptr`.
///
/// # Safety
/// `view` must be the pointer CPython passed to `__getbuffer__`; `ptr..ptr+len` must stay valid
/// until the matching `__releasebuffer__`.
unsafe fn fill_view(view: *mut ffi::Py_buffer, obj: &Bound<'_, PyAny>, ptr: *mut u8, len: usize, readonly: bool, flags: c_int) {
    // SAFETY: `view` is valid for writes (caller); every field is written before use.
    unsafe {
        (*view).obj = obj.clone().into_ptr();
        (*view).buf = ptr.cast();
        (*view).len = len as isize;
        (*view).readonly = readonly as c_int;
        (*view).itemsize = 1;
        (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT { c"B".as_ptr().cast_mut() } else { std::ptr::null_mut() };
        (*view).ndim = 1;
        (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND { &mut (*view).len } else { std::ptr::null_mut() };
        (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES { &mut (*view).itemsize } else { std::ptr::null_mut() };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = std::ptr::null_mut();
    }
}

/// A buffer loaned in the shared segment for one outgoing message (writable buffer protocol).
#[pyclass(module = "colo._colo")]
pub struct Loan {
    state: Mutex<Option<LoanState>>,
    ptr: RawPtr,
    len: usize,
    cap: usize,
    zero_copy: bool,
    exports: Mutex<usize>,
}

#[pymethods]
impl Loan {
    /// Sends the first `nbytes` bytes (default: the size asked for). Every memoryview of the loan
    /// must be released first (`BufferError` otherwise): the receiver reads these very bytes.
    #[pyo3(signature = (nbytes=None))]
    fn send(&self, py: Python<'_>, nbytes: Option<usize>) -> PyResult<()> {
        let n = nbytes.unwrap_or(self.len);
        if n > self.cap {
            return Err(PyValueError::new_err(format!("nbytes {n} exceeds the loan's capacity {}", self.cap)));
        }
        if *lock(&self.exports) > 0 {
            return Err(PyBufferError::new_err("release every memoryview of the loan before sending it"));
        }
        let mut st = lock(&self.state).take().ok_or_else(closed)?;
        st.loan.set_len(n);
        let LoanState { loan, _conn, timeout } = st;
        // Over TCP the frame is written in one call, bounded by the connection's timeout, not
        // by the slice a `blocking` call left on the stream.
        let _ = _conn.set_write_timeout(timeout.filter(|&t| t > 0.0).map(Duration::from_secs_f64));
        let loan = SendLoan(loan);
        let r = py.allow_threads(move || {
            let whole = loan;
            whole.0.send()
        });
        drop(_conn);
        r.map_err(|e| to_py(e, None))
    }

    /// Gives the slot back unsent (idempotent after send/cancel: no-op).
    fn cancel(&self) -> PyResult<()> {
        if *lock(&self.exports) > 0 {
            return Err(PyBufferError::new_err("release every memoryview of the loan first"));
        }
        lock(&self.state).take();
        Ok(())
    }

    /// Bytes the buffer holds.
    #[getter]
    fn capacity(&self) -> usize {
        self.cap
    }

    /// Whether the buffer is in shared memory (False over a TCP fallback).
    #[getter]
    fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// The buffer's address (for checking that no copy is made).
    #[getter]
    fn address(&self) -> usize {
        self.ptr.0 as usize
    }

    fn __len__(&self) -> usize {
        self.len
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving a `with` block cancels the loan if it was not sent.
    fn __exit__(&self, _t: Option<Bound<'_, PyAny>>, _v: Option<Bound<'_, PyAny>>, _tb: Option<Bound<'_, PyAny>>) -> PyResult<bool> {
        self.cancel()?;
        Ok(false)
    }

    /// Exports `len(loan)` writable bytes.
    ///
    /// # Safety
    /// Called by CPython with a valid `view`.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.borrow();
        if lock(&this.state).is_none() {
            return Err(PyBufferError::new_err("the loan was sent or cancelled"));
        }
        *lock(&this.exports) += 1;
        let (ptr, len) = (this.ptr.0, this.len);
        drop(this);
        // SAFETY: the slot (or heap buffer) stays valid while exported: send and cancel refuse
        // to run while `exports` > 0.
        unsafe { fill_view(view, slf.as_any(), ptr, len, false, flags) };
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut e = lock(&self.exports);
        *e = e.saturating_sub(1);
    }
}

/// A received message, read in place in the shared segment (read-only buffer protocol).
#[pyclass(module = "colo._colo")]
pub struct Message {
    state: Mutex<Option<MsgState>>,
    ptr: RawPtr,
    len: usize,
    zero_copy: bool,
    exports: Mutex<usize>,
}

#[pymethods]
impl Message {
    /// Gives the slot back to the sender. Every memoryview of the message must be released
    /// first (`BufferError` otherwise). Releasing twice raises `OSError(EBADF)`.
    fn release(&self) -> PyResult<()> {
        if *lock(&self.exports) > 0 {
            return Err(PyBufferError::new_err("release every memoryview of the message first"));
        }
        let st = lock(&self.state).take().ok_or_else(closed)?;
        drop(st);
        Ok(())
    }

    #[getter]
    fn released(&self) -> bool {
        lock(&self.state).is_none()
    }

    /// Whether the bytes are read in place in shared memory (False over a TCP fallback).
    #[getter]
    fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// The bytes' address (for checking that no copy is made).
    #[getter]
    fn address(&self) -> usize {
        self.ptr.0 as usize
    }

    /// A copy of the bytes.
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let st = lock(&self.state);
        let st = st.as_ref().ok_or_else(closed)?;
        Ok(PyBytes::new(py, &st.msg))
    }

    fn __len__(&self) -> usize {
        self.len
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving a `with` block releases the message (if not released yet).
    fn __exit__(&self, _t: Option<Bound<'_, PyAny>>, _v: Option<Bound<'_, PyAny>>, _tb: Option<Bound<'_, PyAny>>) -> PyResult<bool> {
        if lock(&self.state).is_some() {
            self.release()?;
        }
        Ok(false)
    }

    /// Exports the message's bytes, read-only.
    ///
    /// # Safety
    /// Called by CPython with a valid `view`.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("a received message is read-only"));
        }
        let this = slf.borrow();
        if lock(&this.state).is_none() {
            return Err(PyBufferError::new_err("the message was released"));
        }
        *lock(&this.exports) += 1;
        let (ptr, len) = (this.ptr.0, this.len);
        drop(this);
        // SAFETY: the slot stays valid while exported: release refuses while `exports` > 0.
        unsafe { fill_view(view, slf.as_any(), ptr, len, true, flags) };
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let mut e = lock(&self.exports);
        *e = e.saturating_sub(1);
    }
}

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
