//! `Listener` and `listen`: a listening colo endpoint.

use crate::*;

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
pub(crate) fn listen(
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
