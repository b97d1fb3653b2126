//! [`Stream`]: one connection, over shared memory when the peer is a colo listener on this host,
//! over TCP otherwise, behind the same `std::io` interface.

use crate::framed::Tcp;
use crate::handshake;
use crate::raw::{RawLoan, RawMessage};
use crate::options::Options;
use crate::error::libc_errno;
use crate::shm::Shm;
use colo_ring::spin::SpinMode;
use colo_sys::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

/// How a [`Stream`] moves its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Shared-memory rings on this host.
    SharedMemory,
    /// A plain TCP connection (remote peer, or a peer that does not speak colo).
    Tcp,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::SharedMemory => "colo",
            Transport::Tcp => "tcp",
        })
    }
}

#[derive(Debug, Clone)]
enum Inner {
    Shm(Arc<Shm>),
    /// A CARRIER connection: the payload moves through `Shm`; the TCP connection stays open,
    /// silent, so the peer's socket keeps its kernel meaning, and closes with the stream.
    Carrier(Arc<(Shm, TcpStream)>),
    Tcp(Arc<Tcp>),
}

/// A connection with socket semantics: `Read`/`Write` (also on `&Stream`), half-close, timeouts,
/// non-blocking mode, a pollable fd, and zero-copy messages.
///
/// ```no_run
/// use std::io::{Read, Write};
/// let mut s = colo::Stream::connect("127.0.0.1:7000")?;   // shared memory if local, else TCP
/// s.write_all(b"ping")?;
/// let mut reply = [0u8; 4];
/// s.read_exact(&mut reply)?;
/// println!("over {}", s.transport());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct Stream {
    inner: Inner,
}

/// What an operation runs on: the shared-memory side, or the TCP socket.
enum Io<'a> {
    Shm(&'a Shm),
    Tcp(&'a TcpStream),
}

impl Stream {
    /// Connects to `addr`: shared memory if a colo listener serves it on this host, else TCP.
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<Stream> {
        Stream::connect_with(addr, &Options::new())
    }

    /// Connects with explicit options (ring and pool sizes, spin policy).
    pub fn connect_with(addr: impl ToSocketAddrs, opts: &Options) -> io::Result<Stream> {
        let mut last = None;
        for a in addr.to_socket_addrs()? {
            match handshake::dial(a, opts) {
                Ok(handshake::Dialed::Direct(shm)) => return Ok(Stream::from_shm(shm)),
                Ok(handshake::Dialed::Carrier(shm, tcp)) => return Ok(Stream::from_carrier(shm, tcp)),
                Ok(handshake::Dialed::Tcp(tcp)) => return Ok(Stream::from_tcp(tcp)),
                Ok(handshake::Dialed::Owed(tcp)) => {
                    let _ = tcp.set_nodelay(true);
                    return Ok(Stream { inner: Inner::Tcp(Arc::new(Tcp::owing(tcp))) });
                }
                Ok(handshake::Dialed::No) => {}
                Err(e) => crate::log::info(format_args!("dial {a}: {e}; using TCP")),
            }
            let tcp = match opts.tcp_connect_limit() {
                Some(t) => TcpStream::connect_timeout(&a, t),
                None => TcpStream::connect(a),
            };
            match tcp {
                Ok(s) => return Ok(Stream::from_tcp(s)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to")))
    }

    pub(crate) fn from_shm(shm: Shm) -> Stream {
        Stream { inner: Inner::Shm(Arc::new(shm)) }
    }

    pub(crate) fn from_carrier(shm: Shm, tcp: TcpStream) -> Stream {
        Stream { inner: Inner::Carrier(Arc::new((shm, tcp))) }
    }

    pub(crate) fn from_tcp(s: TcpStream) -> Stream {
        let _ = s.set_nodelay(true);
        Stream { inner: Inner::Tcp(Arc::new(Tcp::new(s))) }
    }

    /// The TCP socket of a fallback connection, and whether its cross-namespace answer is still
    /// owed (for the tokio wrapper).
    #[cfg(feature = "tokio")]
    pub(crate) fn into_tcp(self) -> Option<(TcpStream, bool)> {
        match self.inner {
            Inner::Tcp(t) => Arc::try_unwrap(t).ok().map(|t| {
                let owed = t.owed.pending();
                (t.sock, owed)
            }),
            Inner::Shm(_) | Inner::Carrier(_) => None,
        }
    }

    pub(crate) fn shm(&self) -> Option<&Shm> {
        match &self.inner {
            Inner::Shm(s) => Some(s),
            Inner::Carrier(c) => Some(&c.0),
            Inner::Tcp(_) => None,
        }
    }

    fn io(&self) -> Io<'_> {
        match &self.inner {
            Inner::Shm(s) => Io::Shm(s),
            Inner::Carrier(c) => Io::Shm(&c.0),
            Inner::Tcp(t) => Io::Tcp(&t.sock),
        }
    }

    /// Whether a non-blocking call on this connection drained a wake-up since the last time this
    /// was asked (always false over TCP). The reading and writing halves share one readiness fd:
    /// an event loop whose read half swallowed a wake-up must retry its write half too, and the
    /// reverse (spec/WIRE.md section 6). The `tokio` feature does this itself.
    pub fn take_swallowed(&self) -> bool {
        self.shm().is_some_and(Shm::take_swallowed)
    }

    /// Whether this connection runs over shared memory or TCP.
    pub fn transport(&self) -> Transport {
        match self.io() {
            Io::Shm(_) => Transport::SharedMemory,
            Io::Tcp(_) => Transport::Tcp,
        }
    }

    /// The peer's address. Over shared memory, the client side's port is 0 (no TCP port exists).
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        match self.io() {
            Io::Shm(s) => Ok(s.peer_addr()),
            Io::Tcp(t) => t.peer_addr(),
        }
    }

    /// Our address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self.io() {
            Io::Shm(s) => Ok(s.local_addr()),
            Io::Tcp(t) => t.local_addr(),
        }
    }

    /// Shuts down reading, writing or both, with TCP's meaning: the peer reads EOF after our last
    /// byte; its writes to a read-shut side fail with `BrokenPipe`.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self.io() {
            Io::Shm(s) => {
                s.shutdown(matches!(how, Shutdown::Read | Shutdown::Both), matches!(how, Shutdown::Write | Shutdown::Both));
                Ok(())
            }
            Io::Tcp(t) => t.shutdown(how),
        }
    }

    /// Another handle to the same connection (one thread may read while another writes).
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(Stream { inner: self.inner.clone() })
    }

    /// Non-blocking mode: operations that would wait fail with `WouldBlock`.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self.io() {
            Io::Shm(s) => {
                s.set_nonblocking(on);
                Ok(())
            }
            Io::Tcp(t) => t.set_nonblocking(on),
        }
    }

    /// Read timeout: a read waiting longer fails with `WouldBlock` (as `TcpStream` on Unix).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero timeout"));
        }
        match self.io() {
            Io::Shm(s) => {
                s.set_read_timeout(t);
                Ok(())
            }
            Io::Tcp(tcp) => tcp.set_read_timeout(t),
        }
    }

    /// Write timeout.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "zero timeout"));
        }
        match self.io() {
            Io::Shm(s) => {
                s.set_write_timeout(t);
                Ok(())
            }
            Io::Tcp(tcp) => tcp.set_write_timeout(t),
        }
    }

    /// The read timeout.
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        match self.io() {
            Io::Shm(s) => Ok(s.read_timeout()),
            Io::Tcp(t) => t.read_timeout(),
        }
    }

    /// The write timeout.
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        match self.io() {
            Io::Shm(s) => Ok(s.write_timeout()),
            Io::Tcp(t) => t.write_timeout(),
        }
    }

    /// Reads without consuming (`MSG_PEEK`).
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.settle_owed()?;
        match self.io() {
            Io::Shm(s) => s.peek(buf),
            Io::Tcp(t) => t.peek(buf),
        }
    }

    /// Changes how long this connection spins before sleeping (shared memory only).
    pub fn set_spin(&self, mode: SpinMode) {
        if let Io::Shm(s) = self.io() {
            s.set_spin(mode);
        }
    }

    /// [`Stream::loan`] without the borrow, for bindings that keep loans in handle tables: the
    /// caller ends it with exactly one [`Stream::send_raw`] or [`Stream::cancel_raw`] on this
    /// stream, and must keep the stream alive until then. The buffer is writable in full.
    pub fn loan_raw(&self, len: usize) -> io::Result<RawLoan> {
        match self.io() {
            Io::Shm(s) => {
                let (slot, ptr) = s.loan(len)?;
                Ok(RawLoan::slot(slot, ptr, s.pool_slot_size() as u32))
            }
            Io::Tcp(_) => {
                let Ok(len) = u32::try_from(len) else {
                    return Err(io::Error::from_raw_os_error(libc_errno::EMSGSIZE));
                };
                Ok(RawLoan::heap(len))
            }
        }
    }

    /// Sends the first `len` bytes of a raw loan ([`Loan::send`](crate::Loan::send)); `len` above the capacity
    /// gives the loan back and fails with `EMSGSIZE`.
    ///
    /// # Safety
    /// `loan` came from [`Stream::loan_raw`] on this stream and was neither sent nor cancelled.
    /// It is spent either way (also when this returns an error).
    #[inline]
    pub unsafe fn send_raw(&self, loan: RawLoan, len: usize) -> io::Result<()> {
        if len > loan.capacity() {
            // SAFETY: the caller's contract, passed on: this stream's live loan, ended here.
            unsafe { self.cancel_raw(loan) };
            return Err(io::Error::from_raw_os_error(libc_errno::EMSGSIZE));
        }
        match loan.into_parts() {
            Ok(slot) => self.shm().expect("slot loans come from shm").send_slot(slot, len),
            Err(heap) => self.send_framed(&heap[..len]),
        }
    }

    /// Gives an unsent raw loan back (dropping a [`Loan`](crate::Loan) unsent).
    ///
    /// # Safety
    /// As for [`Stream::send_raw`]: `loan` is this stream's, and live.
    #[inline]
    pub unsafe fn cancel_raw(&self, loan: RawLoan) {
        if let (Ok(slot), Some(shm)) = (loan.into_parts(), self.shm()) {
            shm.unloan(slot);
        }
    }

    /// [`Stream::recv_message`] without the borrow (see [`Stream::loan_raw`]): the caller releases
    /// the message with exactly one [`Stream::release_raw`] on this stream, which it keeps alive
    /// until then.
    pub fn recv_raw(&self) -> io::Result<Option<RawMessage>> {
        match self.io() {
            Io::Shm(s) => Ok(s.recv_message()?.map(|(slot, ptr, len)| RawMessage::slot(slot, ptr, len as u32))),
            Io::Tcp(_) => Ok(self.tcp().recv()?.map(RawMessage::heap)),
        }
    }

    /// Releases a raw message (dropping a [`Message`](crate::Message)): the sender gets its slot back.
    ///
    /// # Safety
    /// `msg` came from [`Stream::recv_raw`] on this stream and was not released before.
    #[inline]
    pub unsafe fn release_raw(&self, msg: RawMessage) {
        if let (Some(slot), Some(shm)) = (msg.into_slot(), self.shm()) {
            shm.release(slot);
        }
    }

    pub(crate) fn send_framed(&self, bytes: &[u8]) -> io::Result<()> {
        self.tcp().send(bytes)
    }

    /// Before a read over TCP: the cross-namespace answer taken off the stream if it is owed
    /// (waiting as the read would).
    fn settle_owed(&self) -> io::Result<()> {
        match &self.inner {
            Inner::Tcp(t) => t.owed.settle(&t.sock),
            Inner::Shm(_) | Inner::Carrier(_) => Ok(()),
        }
    }

    fn tcp(&self) -> &Tcp {
        match &self.inner {
            Inner::Tcp(t) => t,
            Inner::Shm(_) | Inner::Carrier(_) => unreachable!("framed messages only over TCP"),
        }
    }

    /// Bytes a zero-copy message may hold on this connection.
    pub fn max_message_size(&self) -> usize {
        match self.io() {
            Io::Shm(s) => s.pool_slot_size(),
            Io::Tcp(_) => u32::MAX as usize,
        }
    }

    /// Bytes ready to read without waiting (`FIONREAD`); 0 over TCP.
    pub fn readable_now(&self) -> io::Result<usize> {
        match self.io() {
            Io::Shm(s) => s.readable(),
            Io::Tcp(_) => Ok(0),
        }
    }

    /// The pid of the process at the other end (shared memory only).
    pub fn peer_pid(&self) -> Option<u32> {
        self.shm().map(Shm::peer_pid)
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.settle_owed()?;
        match self.io() {
            Io::Shm(s) => s.read(buf),
            Io::Tcp(t) => (&*t).read(buf),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.io() {
            Io::Shm(s) => s.write(buf),
            Io::Tcp(t) => (&*t).write(buf),
        }
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self.io() {
            Io::Shm(s) => s.write_all(buf),
            Io::Tcp(t) => (&*t).write_all(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        (&*self).write_all(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for Stream {
    /// The readiness fd: for shared memory an epoll fd that is readable when the peer made
    /// progress (data, space, a message, a close) or hung up; for TCP the socket.
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self.io() {
            Io::Shm(s) => s.readiness_fd().as_fd(),
            Io::Tcp(t) => t.as_fd(),
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}
