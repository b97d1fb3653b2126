//! Zero-copy messages on a TCP fallback (spec/WIRE.md section 7, "Over TCP"): each message is a
//! `u32` little-endian length and its bytes on the byte stream. A receive interrupted by a
//! timeout, non-blocking mode or a signal keeps what it has read and goes on from there at the
//! next call; a send is all or nothing.

use crate::owed::Owed;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::Duration;

/// A TCP fallback connection and the framing state of its messages.
#[derive(Debug)]
pub(crate) struct Tcp {
    pub(crate) sock: TcpStream,
    rx: Mutex<FrameRx>,
    /// Held while a frame is written, so that frames of two threads do not interleave.
    tx: Mutex<()>,
    /// The answer to a cross-namespace PROPOSAL, owed on a connection dialed past its wait.
    pub(crate) owed: Owed,
}

/// The message being received: its length header, then its bytes.
#[derive(Debug, Default)]
struct FrameRx {
    head: [u8; 4],
    head_len: usize,
    body: Vec<u8>,
}

/// Bytes added to a receive buffer at a time: the length comes from the peer, so the buffer grows
/// as bytes arrive instead of trusting it.
const GROW: usize = 1 << 20;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn cut_short() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection in the middle of a message")
}

impl Tcp {
    pub(crate) fn new(sock: TcpStream) -> Tcp {
        Tcp { sock, rx: Mutex::default(), tx: Mutex::default(), owed: Owed::default() }
    }

    /// A connection whose cross-namespace answer is owed ([`Owed`]).
    pub(crate) fn owing(sock: TcpStream) -> Tcp {
        Tcp { owed: Owed::owing(), ..Tcp::new(sock) }
    }

    /// The next message, `None` at end of stream (between messages). An error (a timeout, would
    /// block, a signal) leaves the part already read for the next call.
    pub(crate) fn recv(&self) -> io::Result<Option<Vec<u8>>> {
        let mut f = lock(&self.rx);
        self.owed.settle(&self.sock)?;
        let mut sock = &self.sock;
        while f.head_len < 4 {
            let at = f.head_len;
            match sock.read(&mut f.head[at..]) {
                Ok(0) if at == 0 => return Ok(None),
                Ok(0) => return Err(cut_short()),
                Ok(n) => f.head_len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let want = u32::from_le_bytes(f.head) as usize;
        while f.body.len() < want {
            let have = f.body.len();
            f.body.resize(have + (want - have).min(GROW), 0);
            let r = sock.read(&mut f.body[have..]);
            f.body.truncate(have + *r.as_ref().unwrap_or(&0));
            match r {
                Ok(0) => return Err(cut_short()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        f.head_len = 0;
        Ok(Some(std::mem::take(&mut f.body)))
    }

    /// Sends one message. Fails without sending anything if the socket takes none of it (would
    /// block, timeout); once part of it is written, waits for the socket to take the rest (up to
    /// the write timeout per wait). Should even that run out, the write side is shut down, so
    /// that the peer sees the stream end in the middle of the message, not a corrupt stream.
    pub(crate) fn send(&self, bytes: &[u8]) -> io::Result<()> {
        let len = u32::try_from(bytes.len()).map_err(|_| io::Error::from_raw_os_error(crate::error::libc_errno::EMSGSIZE))?;
        let head = len.to_le_bytes();
        let _one_at_a_time = lock(&self.tx);
        let mut sock = &self.sock;
        let total = head.len() + bytes.len();
        let mut done = 0;
        while done < total {
            let r = if done < head.len() {
                sock.write_vectored(&[io::IoSlice::new(&head[done..]), io::IoSlice::new(bytes)])
            } else {
                sock.write(&bytes[done - head.len()..])
            };
            match r {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if done > 0 && matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    let limit: Option<Duration> = self.sock.write_timeout()?;
                    if !colo_sys::tcp::wait_writable(colo_sys::AsFd::as_fd(&self.sock), limit)? {
                        let _ = self.sock.shutdown(std::net::Shutdown::Write);
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "a message was cut short by the write timeout; the connection's write side is shut down",
                        ));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
