//! `Conn` and `connect`: a connection with the methods of a `socket.socket`.

use crate::message::{SendLoan, SendMsg};
use crate::*;

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
    pub(crate) fn new(s: Stream) -> Conn {
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
        let SendLoan(loan) = r?;
        Ok(Loan::new(loan, s, size, *lock(&self.timeout)))
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
        Ok(Some(Message::new(msg, s)))
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
pub(crate) fn connect(
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
