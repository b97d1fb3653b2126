//! A plain TCP connection whose cross-namespace PROPOSAL (spec/WIRE.md section 11) went
//! unanswered while its client waited: the server's program had not accepted it. Over TCP a
//! late accept does not fail a connection, so the dial goes on over plain TCP, and the answer,
//! which the server sends first on the stream whenever it gets to the connection, is owed:
//! taken off the stream before the application reads anything. Nothing can come before it.

use crate::netns::{self, Late};
use colo_sys::AsFd;
use std::io;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Whether a connection's answer is still owed, and since when its stream has begun with part
/// of one.
#[derive(Debug, Default)]
pub(crate) struct Owed {
    /// Cleared (Release) once the answer is off the stream, or the stream shows none will come;
    /// the reads that load it (Acquire) then read the application's bytes.
    owed: AtomicBool,
    /// Held while the head of the stream is looked at: one reader takes the answer, once.
    partial_since: Mutex<Option<Instant>>,
}

impl Owed {
    /// The answer owed on a connection whose client stopped waiting for it.
    pub(crate) fn owing() -> Owed {
        Owed { owed: AtomicBool::new(true), partial_since: Mutex::default() }
    }

    /// Whether the answer is still owed.
    pub(crate) fn pending(&self) -> bool {
        self.owed.load(Ordering::Acquire)
    }

    /// Before a read of `sock`: takes the answer off the stream if it is owed, waiting for it as
    /// the read would wait for bytes (a blocking socket, up to its read timeout). `Err`: the read fails so (`WouldBlock` while the answer
    /// has not come). A stream that begins with part of an answer which does not grow within
    /// the answer wait is the application's as it is.
    pub(crate) fn settle(&self, sock: &TcpStream) -> io::Result<()> {
        if !self.pending() {
            return Ok(());
        }
        let mut since = self.partial_since.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if !self.pending() {
                return Ok(());
            }
            match netns::take_answer(sock.as_fd()) {
                Late::Taken | Late::NotAnswer => {
                    self.owed.store(false, Ordering::Release);
                    return Ok(());
                }
                Late::NotYet => {}
            }
            let partial = colo_sys::tcp::unread(sock.as_fd()) > 0;
            if partial && since.get_or_insert_with(Instant::now).elapsed() >= crate::carrier::timeout() {
                self.owed.store(false, Ordering::Release);
                return Ok(());
            }
            if colo_sys::tcp::nonblocking(sock.as_fd()) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if partial {
                // Readable already (the part): a wait for more bytes would return at once.
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let limit = sock.read_timeout()?;
            if !colo_sys::pathsock::wait_readable(sock.as_fd(), limit.unwrap_or(Duration::MAX))? {
                // As a read whose timeout ran out: EAGAIN.
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }
}

/// How long dials to a server whose program left a PROPOSAL unanswered go plain TCP without
/// one: its next connections would only wait the same way (a server busy or stopped).
const LATE_FOR: Duration = Duration::from_secs(1);

/// Servers found late ([`late_server`]), and until when; a few at a time.
static LATE: Mutex<Vec<(std::net::SocketAddr, Instant)>> = Mutex::new(Vec::new());

/// The server at `addr` left a PROPOSAL unanswered past the wait.
pub(crate) fn late_server(addr: std::net::SocketAddr) {
    let mut late = LATE.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    late.retain(|&(a, until)| a != addr && until > now);
    if late.len() < 64 {
        late.push((addr, now + LATE_FOR));
    }
}

/// Whether the server at `addr` was found late within the last `LATE_FOR`.
pub(crate) fn recently_late(addr: std::net::SocketAddr) -> bool {
    let late = LATE.lock().unwrap_or_else(|e| e.into_inner());
    late.iter().any(|&(a, until)| a == addr && until > Instant::now())
}

#[cfg(test)]
mod tests {
    use super::Owed;
    use crate::netns::{ANSWER_LEN, MAGIC};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    /// A connected pair: (client, server's end).
    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (c, l.accept().unwrap().0)
    }

    fn answer() -> [u8; ANSWER_LEN] {
        let mut a = [0u8; ANSWER_LEN];
        a[..8].copy_from_slice(&MAGIC);
        a[8] = 3;
        a
    }

    #[test]
    fn a_late_server_is_remembered_alone() {
        let (a, b) = ("10.9.8.7:1".parse().unwrap(), "10.9.8.7:2".parse().unwrap());
        super::late_server(a);
        assert!(super::recently_late(a));
        assert!(!super::recently_late(b));
    }

    #[test]
    fn a_late_answer_is_taken_off_before_the_first_read() {
        let (c, mut s) = pair();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let owed = Owed::owing();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            // In two parts: the first alone is not taken for the answer, nor given to the reader.
            let a = answer();
            s.write_all(&a[..20]).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            s.write_all(&a[20..]).unwrap();
            s.write_all(b"banner").unwrap();
            s
        });
        owed.settle(&c).unwrap();
        assert!(!owed.pending());
        let mut got = [0u8; 6];
        (&c).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"banner");
        drop(late.join().unwrap());
    }

    #[test]
    fn a_read_timeout_runs_out_as_a_read_would_and_the_answer_is_still_taken_later() {
        let (c, mut s) = pair();
        c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let owed = Owed::owing();
        let e = owed.settle(&c).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        assert!(owed.pending());
        s.write_all(&answer()).unwrap();
        s.write_all(b"x").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        owed.settle(&c).unwrap();
        let mut got = [0u8; 1];
        (&c).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"x");
    }

    #[test]
    fn an_echoed_proposal_is_not_taken_for_the_answer() {
        let (c, mut s) = pair();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let owed = Owed::owing();
        // A server that is not colo echoes the PROPOSAL (type 1) and the bytes behind it.
        let mut echo = answer();
        echo[8] = 1;
        s.write_all(&echo).unwrap();
        owed.settle(&c).unwrap();
        assert!(!owed.pending());
        let mut got = [0u8; ANSWER_LEN];
        (&c).read_exact(&mut got).unwrap();
        assert_eq!(got, echo);
    }

    #[test]
    fn a_stream_that_is_not_an_answer_is_left_whole() {
        let (c, mut s) = pair();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let owed = Owed::owing();
        s.write_all(b"HTTP/1.1 200 OK\r\n").unwrap();
        owed.settle(&c).unwrap();
        assert!(!owed.pending());
        let mut got = [0u8; 17];
        (&c).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"HTTP/1.1 200 OK\r\n");
        // Nonblocking, nothing owed: no wait.
        drop(s);
        c.set_nonblocking(true).unwrap();
        owed.settle(&c).unwrap();
    }
}
