//! Async colo for tokio (feature `tokio`): [`Listener`] and [`Stream`] with `AsyncRead`/`AsyncWrite`.
//!
//! A shared-memory stream waits on its readiness fd (an epoll fd holding the control socket, which
//! is the doorbell, and the self bell) registered in tokio's reactor. Both halves of a stream wait on that one fd, so
//! the waker handed to tokio wakes whichever halves are waiting; each re-checks its own condition.
//!
//! ```no_run
//! # async fn f() -> std::io::Result<()> {
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! let listener = colo::tokio::Listener::bind("127.0.0.1:7000")?;
//! let (mut s, _) = listener.accept().await?;
//! let mut buf = [0u8; 4];
//! s.read_exact(&mut buf).await?;
//! s.write_all(&buf).await?;
//! # Ok(()) }
//! ```

use crate::{Options, Transport};
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Wakes every half that waits on the shared readiness fd.
#[derive(Default)]
struct FanOut {
    read: Mutex<Option<Waker>>,
    write: Mutex<Option<Waker>>,
}

impl Wake for FanOut {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        for slot in [&self.read, &self.write] {
            if let Some(w) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                w.wake();
            }
        }
    }
}

struct Shm {
    // Declared before `stream`: deregistered before the fd it watches is closed.
    fd: AsyncFd<Fd>,
    fan: Arc<FanOut>,
    stream: crate::Stream,
}

impl Shm {
    fn poll_io<T>(&self, cx: &mut Context<'_>, write: bool, mut op: impl FnMut() -> io::Result<T>) -> Poll<io::Result<T>> {
        loop {
            match op() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return Poll::Ready(r),
            }
            let (slot, other) = if write { (&self.fan.write, &self.fan.read) } else { (&self.fan.read, &self.fan.write) };
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
            // We may have drained a ring meant for the other half before the reactor saw it.
            if self.stream.shm().is_some_and(|s| s.take_swallowed()) {
                if let Some(w) = other.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    w.wake();
                }
            }
            let fan = Waker::from(self.fan.clone());
            match self.fd.poll_read_ready(&mut Context::from_waker(&fan)) {
                Poll::Ready(Ok(mut guard)) => guard.clear_ready(),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

enum Inner {
    Shm(Shm),
    /// With the cross-namespace answer still owed (`crate::owed`): since when the stream has
    /// begun with part of one, if it has.
    Tcp(tokio::net::TcpStream, Option<Owed>),
}

/// A cross-namespace answer owed on a TCP stream (`crate::owed`, for the async reads).
#[derive(Default)]
struct Owed {
    partial_since: Option<std::time::Instant>,
}

/// Takes the owed answer off `t`'s stream, as [`crate::owed::Owed::settle`] does for a
/// blocking read: ready (`owed` cleared) once it is off, or the stream shows none will come.
fn poll_owed(t: &tokio::net::TcpStream, owed: &mut Option<Owed>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    use crate::netns::{take_answer, Late};
    use std::os::fd::AsFd;
    while let Some(o) = owed {
        if take_answer(t.as_fd()) != Late::NotYet {
            *owed = None;
            break;
        }
        if colo_sys::tcp::unread(t.as_fd()) > 0 {
            // Part of an answer: looked at again at once, for at most the answer wait.
            if o.partial_since.get_or_insert_with(std::time::Instant::now).elapsed() >= crate::carrier::timeout() {
                *owed = None;
                break;
            }
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        // Nothing yet: a look that would block clears tokio's readiness, then wait for more.
        let mut one = [0u8; 1];
        match t.try_io(tokio::io::Interest::READABLE, || colo_sys::pathsock::recv_tcp(t.as_fd(), &mut one, true)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => match t.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            },
            _ => {}
        }
    }
    Poll::Ready(Ok(()))
}

/// An async colo connection: shared memory to a local colo listener, TCP otherwise.
pub struct Stream {
    inner: Inner,
}

impl Stream {
    /// Connects like [`crate::Stream::connect`], without blocking the runtime.
    pub async fn connect(addr: impl ToSocketAddrs + Send + 'static) -> io::Result<Stream> {
        Stream::connect_with(addr, Options::new()).await
    }

    /// Connects with options.
    pub async fn connect_with(addr: impl ToSocketAddrs + Send + 'static, opts: Options) -> io::Result<Stream> {
        let s = tokio::task::spawn_blocking(move || crate::Stream::connect_with(addr, &opts))
            .await
            .map_err(io::Error::other)??;
        Stream::from_std(s)
    }

    /// Wraps a blocking [`crate::Stream`] (switching it to non-blocking mode).
    pub fn from_std(s: crate::Stream) -> io::Result<Stream> {
        s.set_nonblocking(true)?;
        let inner = match s.transport() {
            Transport::SharedMemory => {
                // SAFETY: the readiness fd belongs to `s`, which the Shm below owns and drops only
                // after this registration (field order).
                let fd = unsafe { AsyncFd::register_with_interest(Fd(s.as_raw_fd()), tokio::io::Interest::READABLE) }
                    .map_err(io::Error::from)?;
                Inner::Shm(Shm { fd, fan: Arc::default(), stream: s })
            }
            Transport::Tcp => {
                let (tcp, owed) = s.into_tcp().expect("tcp transport");
                Inner::Tcp(tokio::net::TcpStream::from_std(tcp)?, owed.then(Owed::default))
            }
        };
        Ok(Stream { inner })
    }

    /// The transport in use.
    pub fn transport(&self) -> Transport {
        match self.inner {
            Inner::Shm(_) => Transport::SharedMemory,
            Inner::Tcp(..) => Transport::Tcp,
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        match &self.inner {
            Inner::Shm(s) => s.stream.peer_addr(),
            Inner::Tcp(t, _) => t.peer_addr(),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(t, owed) => {
                if owed.is_some() {
                    std::task::ready!(poll_owed(t, owed, cx))?;
                }
                Pin::new(t).poll_read(cx, buf)
            }
            Inner::Shm(s) => {
                let dst = buf.initialize_unfilled();
                match s.poll_io(cx, false, || io::Read::read(&mut &s.stream, dst)) {
                    Poll::Ready(Ok(n)) => {
                        buf.advance(n);
                        Poll::Ready(Ok(()))
                    }
                    Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(t, _) => Pin::new(t).poll_write(cx, buf),
            Inner::Shm(s) => s.poll_io(cx, true, || io::Write::write(&mut &s.stream, buf)),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(t, _) => Pin::new(t).poll_flush(cx),
            Inner::Shm(_) => Poll::Ready(Ok(())),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().inner {
            Inner::Tcp(t, _) => Pin::new(t).poll_shutdown(cx),
            Inner::Shm(s) => Poll::Ready(s.stream.shutdown(std::net::Shutdown::Write)),
        }
    }
}

/// An async colo listener: shared memory for local colo clients, TCP for everyone else.
pub struct Listener {
    // Declared before `inner`: deregistered before the fd it watches is closed.
    fd: AsyncFd<Fd>,
    inner: crate::Listener,
}

impl Listener {
    /// Binds like [`crate::Listener::bind`].
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<Listener> {
        Listener::from_std(crate::Listener::bind(addr)?)
    }

    /// Wraps a blocking listener.
    pub fn from_std(l: crate::Listener) -> io::Result<Listener> {
        l.set_nonblocking(true)?;
        // SAFETY: the fd belongs to `l`, owned by the Listener and dropped after this registration.
        let fd = unsafe { AsyncFd::register_with_interest(Fd(l.as_raw_fd()), tokio::io::Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Listener { fd, inner: l })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// Accepts the next connection.
    pub async fn accept(&self) -> io::Result<(Stream, SocketAddr)> {
        loop {
            match self.inner.accept() {
                Ok((s, a)) => return Ok((Stream::from_std(s)?, a)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            self.fd.readable().await?.clear_ready();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Inner, Owed, Stream};
    use crate::netns::{ANSWER_LEN, MAGIC};
    use std::io::Write;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_late_answer_is_taken_off_before_the_first_async_read() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        c.set_nonblocking(true).unwrap();
        let mut s = l.accept().unwrap().0;
        let mut stream = Stream { inner: Inner::Tcp(tokio::net::TcpStream::from_std(c).unwrap(), Some(Owed::default())) };
        let late = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let mut a = [0u8; ANSWER_LEN];
            a[..8].copy_from_slice(&MAGIC);
            a[8] = 3; // DECLINE
            s.write_all(&a[..30]).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(30));
            s.write_all(&a[30..]).unwrap();
            s.write_all(b"banner").unwrap();
            s
        });
        let mut got = [0u8; 6];
        tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_exact(&mut got)).await.expect("watchdog").unwrap();
        assert_eq!(&got, b"banner");
        assert!(matches!(stream.inner, Inner::Tcp(_, None)));
        drop(late.join().unwrap());
    }
}
