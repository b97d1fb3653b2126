//! `Loan` and `Message`: zero-copy messages exported through the buffer protocol.

use crate::*;

struct RawPtr(*mut u8);
// SAFETY: the pointer is into memory owned by the object's state (the segment, kept mapped by
// `_conn`, or a heap buffer inside the loan/message); it is only dereferenced by Python through
// a buffer export, which the object tracks, and never after the state is dropped.
unsafe impl Send for RawPtr {}
// SAFETY: as above; the pointer value itself is immutable.
unsafe impl Sync for RawPtr {}

/// A loan carried out of the GIL-free closure that took it (`Conn::loan`).
pub(crate) struct SendLoan(pub(crate) CoreLoan<'static>);
// SAFETY: a loan is used by one thread at a time (behind a mutex); its pointer is into memory
// kept alive by the `Arc<Stream>` stored next to it.
unsafe impl Send for SendLoan {}
/// A message carried out of the GIL-free closure that received it (`Conn::recv_message`).
pub(crate) struct SendMsg(pub(crate) CoreMessage<'static>);
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

impl Loan {
    /// The Python object of `loan`, taken on `conn` (which must be the `Stream` the loan
    /// borrows: it is kept alive for as long as the loan) with the connection's `timeout`.
    pub(crate) fn new(mut loan: CoreLoan<'static>, conn: Arc<Stream>, size: usize, timeout: Option<f64>) -> Loan {
        let cap = loan.capacity();
        loan.set_len(cap);
        let ptr = loan.as_mut_ptr();
        let zero_copy = loan.is_zero_copy();
        Loan {
            state: Mutex::new(Some(LoanState { loan, _conn: conn, timeout })),
            ptr: RawPtr(ptr),
            len: size,
            cap,
            zero_copy,
            exports: Mutex::new(0),
        }
    }
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

impl Message {
    /// The Python object of `msg`, received on `conn` (which must be the `Stream` the message
    /// borrows: it is kept alive for as long as the message).
    pub(crate) fn new(msg: CoreMessage<'static>, conn: Arc<Stream>) -> Message {
        let (ptr, len, zero_copy) = (msg.as_ptr(), msg.len(), msg.is_zero_copy());
        Message { state: Mutex::new(Some(MsgState { msg, _conn: conn })), ptr: RawPtr(ptr.cast_mut()), len, zero_copy, exports: Mutex::new(0) }
    }
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
