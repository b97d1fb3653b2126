//! A listener's connections from listed peers of other network namespaces (spec/WIRE.md
//! section 11), resolved without a wait in `accept` (the API's listener, and the LD_PRELOAD
//! shim's accept through `internal::netns_accept`): each waits in a set of its own, first for
//! its PROPOSAL (up to `COLO_NETNS_WAIT_MS`), then, answered ACCEPT, for the HELLO proving it (up
//! to `COLO_CARRIER_TIMEOUT_MS`), watched by the listener's poll set (the socket, the
//! rendezvous, and a timer for the deadlines). Meanwhile `accept` returns every other
//! connection, and each of these once resolved: on shared memory, or plain TCP with the stream
//! as the client sent it (a PROPOSAL answered is consumed on both sides). So a listed peer that
//! stays silent, or never sends its HELLO, delays its own connection only.

use crate::carrier::Established;
use crate::log;
use crate::netns::{self, Opening, Rendezvous, PROPOSAL_LEN};
use colo_sys::doorbell::Poller;
use colo_sys::{AsFd, OwnedFd};
use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Connections waiting at once; beyond, the listener (the API's and the shim's) pushes out the
/// oldest ([`NetnsAccepts::evict_oldest`]).
pub const MAX_WAITING: usize = 256;

/// How soon a connection whose first bytes are the start of a PROPOSAL is looked at again when
/// its socket cannot be told to wait for more (`SO_RCVLOWAT`): it is not watched meanwhile (it
/// stays readable, and would wake every poll).
const PARTIAL_LOOK: Duration = Duration::from_millis(1);

#[derive(Debug)]
enum Stage {
    /// Waiting for the first bytes.
    Opening,
    /// Answered ACCEPT with this server nonce: waiting for the HELLO that proves it.
    Hello([u8; 16]),
}

#[derive(Debug)]
struct Waiting {
    tcp: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    stage: Stage,
    deadline: Instant,
    /// Not looked at before (the start of a PROPOSAL came, and `SO_RCVLOWAT` could not be
    /// raised: the rest is on its way).
    not_before: Option<Instant>,
    /// `SO_RCVLOWAT` is raised on `tcp` (the start of a PROPOSAL came: its socket is reported
    /// once more bytes are queued) from this value (an accepted socket has its listener's), put
    /// back before the stream goes on.
    lowat: Option<usize>,
}

impl Waiting {
    /// Until `n` bytes are queued (or the stream ends), its socket is not reported readable.
    fn wait_for_bytes(&mut self, n: usize) -> bool {
        let Some(was) = self.lowat.or_else(|| colo_sys::tcp::rcvlowat(self.tcp.as_fd())) else { return false };
        let done = colo_sys::tcp::set_rcvlowat(self.tcp.as_fd(), n).is_ok();
        if done {
            self.lowat = Some(was);
        }
        done
    }

    /// The socket's `SO_RCVLOWAT` back to what it was, as the application or the carrier
    /// expects it.
    fn lower(&mut self) {
        if let Some(was) = self.lowat.take() {
            let _ = colo_sys::tcp::set_rcvlowat(self.tcp.as_fd(), was);
        }
    }

    /// Whether the peer ended its stream (a FIN, or an error): no more bytes will come.
    fn ended(&self) -> bool {
        colo_sys::tcp::peer_ended(self.tcp.as_fd())
    }

    fn next_look(&self) -> Instant {
        self.not_before.map_or(self.deadline, |t| t.min(self.deadline))
    }
}

/// A connection whose wait is over: its proved offer claimed (the segment, and the TCP connection
/// that now carries only FIN/RST), or plain TCP with the stream as the client sent it (a
/// PROPOSAL answered is consumed on both sides). Either socket is non-blocking.
#[derive(Debug)]
pub enum Resolved {
    Shm(Established, TcpStream),
    Tcp(TcpStream),
}

/// The connections of one listener that wait, and those resolved that `accept` has not returned.
#[derive(Debug)]
pub struct NetnsAccepts {
    waiting: Vec<Waiting>,
    ready: VecDeque<(Resolved, SocketAddr)>,
    /// Armed for the earliest deadline or look: in the listener's poll set under `token`.
    timer: OwnedFd,
    token: u64,
    /// Whether the rendezvous's wait fd is in the poll set (while a connection waits for a HELLO,
    /// or always: `watch_rendezvous`).
    watching: bool,
    /// The rendezvous is watched, and looked at each step, whether or not a HELLO is awaited.
    always: bool,
    /// The set was full and pushed one out (logged once until it is half empty again).
    full: bool,
}

impl NetnsAccepts {
    /// An empty set whose timer, and later sockets, `poller` watches under `token`.
    pub fn new(poller: &Poller, token: u64) -> io::Result<NetnsAccepts> {
        let timer = colo_sys::timer::create()?;
        poller.add(&timer, token)?;
        Ok(NetnsAccepts { waiting: Vec::new(), ready: VecDeque::new(), timer, token, watching: false, always: false, full: false })
    }

    /// Watches the rendezvous `r` from now on, whether or not a HELLO is awaited: what arrives
    /// there is read at the next step (a HELLO that proves no live nonce, forged or late, is
    /// answered REJECT then, not at the next connection from another namespace). For a listener
    /// whose accept waits on the poll set itself (the API's); a wait that the application's own
    /// event loop makes would wake for every connection at the rendezvous.
    pub fn watch_rendezvous(&mut self, r: &Rendezvous, poller: &Poller) {
        self.always = true;
        if !self.watching && poller.add(r.wait_fd(), self.token).is_ok() {
            self.watching = true;
        }
    }

    /// Closes every connection held here, waiting or ready, and leaves the poll set as it is:
    /// for a fork child's copy of its parent's set, whose poll set is the parent's too (an epoll
    /// instance is shared across fork) and whose connections the parent hands out; the child's
    /// copies of their sockets would keep them open after the parent's application closed them.
    pub fn let_go(&mut self) {
        self.waiting.clear();
        self.ready.clear();
    }

    /// Closes every connection held here (as [`NetnsAccepts::let_go`]) and ends the wait for
    /// each HELLO they were waiting for at `r`, their rendezvous: for a listener closed in the
    /// process that holds them, whose nonces would otherwise stay live.
    pub fn close(&mut self, r: &Rendezvous) {
        for w in std::mem::take(&mut self.waiting) {
            if let Stage::Hello(server) = w.stage {
                let _ = r.finish(&server);
            }
        }
        self.ready.clear();
    }

    /// Takes `tcp`, just accepted from `peer` (a listed peer of another namespace), to wait
    /// here; gives it back when the set is full or its socket cannot be watched.
    pub fn admit(&mut self, tcp: TcpStream, peer: SocketAddr, poller: &Poller) -> Result<(), TcpStream> {
        if self.waiting.len() >= MAX_WAITING {
            return Err(tcp);
        }
        let Ok(local) = tcp.local_addr() else { return Err(tcp) };
        // Once: a report is followed by a look, which watches it again if nothing came.
        if poller.add_once(&tcp, self.token).is_err() {
            return Err(tcp);
        }
        let deadline = Instant::now() + netns::first_bytes_wait();
        self.waiting.push(Waiting { tcp, peer, local, stage: Stage::Opening, deadline, not_before: None, lowat: None });
        self.full &= self.waiting.len() > MAX_WAITING / 2;
        self.arm();
        Ok(())
    }

    /// The next resolved connection, if any.
    pub fn pop(&mut self) -> Option<(Resolved, SocketAddr)> {
        self.ready.pop_front()
    }

    /// How many connections wait (not counting those resolved).
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Whether a resolved connection waits to be returned.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Looks once at every waiting connection (nothing here waits): answers the PROPOSALs that
    /// came, claims the HELLOs that came, and resolves as plain TCP those whose wait is over.
    pub fn step(&mut self, r: &Rendezvous, poller: &Poller) {
        colo_sys::timer::drain(&self.timer);
        let now = Instant::now();
        if self.always || self.waiting.iter().any(|w| matches!(w.stage, Stage::Hello(_))) {
            r.look();
        }
        for mut w in std::mem::take(&mut self.waiting) {
            match w.stage {
                Stage::Opening => {
                    if w.not_before.is_some_and(|t| t > now) && w.deadline > now {
                        self.waiting.push(w);
                        continue;
                    }
                    let mut p = [0u8; PROPOSAL_LEN];
                    match netns::peek_proposal(w.tcp.as_fd(), &mut p) {
                        Opening::Plain => self.plain(poller, w),
                        Opening::NotYet(_) if now >= w.deadline => self.plain(poller, w),
                        // The start of a PROPOSAL, and no more will come: plain TCP, as sent.
                        Opening::NotYet(n) if n > 0 && w.ended() => self.plain(poller, w),
                        Opening::NotYet(n) => {
                            // Reported again once one more byte is queued (or the stream ends),
                            // else at its deadline: no look between.
                            let told = n == 0 || w.wait_for_bytes(n + 1);
                            w.not_before = None;
                            if !told || poller.rearm_once(&w.tcp, self.token).is_err() {
                                w.not_before = Some(now + PARTIAL_LOOK);
                            }
                            self.waiting.push(w);
                        }
                        Opening::Proposal => {
                            w.lower();
                            // Watched once more while its HELLO is awaited: bytes there instead
                            // mean the client went on over plain TCP (below).
                            if poller.rearm_once(&w.tcp, self.token).is_err() {
                                let _ = poller.delete(&w.tcp);
                            }
                            // 112 bytes first on a new connection: room is there, or the
                            // connection is of no use (no wait for it here).
                            match r.answer(w.tcp.as_fd(), w.peer, &p, Duration::ZERO) {
                                Some(server) => {
                                    w.stage = Stage::Hello(server);
                                    w.deadline = now + netns::hello_wait();
                                    w.not_before = None;
                                    self.waiting.push(w);
                                }
                                None => self.deliver_tcp(w),
                            }
                        }
                    }
                }
                Stage::Hello(server) => {
                    // Bytes on the stream instead of a HELLO (the client stopped waiting for
                    // the answer and went on over plain TCP: spec/WIRE.md section 11, step 3),
                    // or its end: no HELLO is coming.
                    let went_on = || netns::client_went_on(w.tcp.as_fd());
                    if !r.arrived(&server) && now < w.deadline && !went_on() {
                        self.waiting.push(w);
                        continue;
                    }
                    self.finish(r, poller, w, &server);
                }
            }
        }
        let want = self.always || self.waiting.iter().any(|w| matches!(w.stage, Stage::Hello(_)));
        if want != self.watching {
            let done = if want { poller.add(r.wait_fd(), self.token) } else { poller.delete(r.wait_fd()) };
            if done.is_ok() {
                self.watching = want;
            }
        }
        self.arm();
    }

    /// Ends the wait of `w` for the HELLO proving `server`: claimed if it came, else plain TCP.
    fn finish(&mut self, r: &Rendezvous, poller: &Poller, w: Waiting, server: &[u8; 16]) {
        let _ = poller.delete(&w.tcp);
        let Some(hello) = r.finish(server) else {
            log::info(format_args!("accept {}: no proved offer in time; plain TCP", w.peer));
            return self.deliver_tcp(w);
        };
        match netns::claim(*hello, w.local, w.peer) {
            Some(est) => self.ready.push_back((Resolved::Shm(est, w.tcp), w.peer)),
            None => self.deliver_tcp(w),
        }
    }

    /// Makes room for one more: the oldest connection still waiting for its first bytes ends
    /// its wait now as plain TCP (a whole PROPOSAL already there, not yet looked at, taken off
    /// the stream and answered DECLINE, so that it never reaches the application; anything
    /// else left as it is); if none does, the oldest waiting for its
    /// HELLO (claimed if it came, else plain TCP: its PROPOSAL and the answer consumed on both
    /// sides). So whoever fills the set pushes out the longest waiting, never the newcomer, and
    /// each goes on byte-exact. Returns whether one was pushed out.
    pub fn evict_oldest(&mut self, r: &Rendezvous, poller: &Poller) -> bool {
        let at = self.waiting.iter().position(|w| matches!(w.stage, Stage::Opening)).or((!self.waiting.is_empty()).then_some(0));
        let Some(at) = at else { return false };
        let w = self.waiting.remove(at);
        if !self.full {
            self.full = true;
            log::info(format_args!("{MAX_WAITING} connections from other namespaces wait: the oldest go on as they stand (plain TCP unless proved)"));
        }
        match w.stage {
            Stage::Opening => {
                netns::decline_now(w.tcp.as_fd(), w.peer, "too many connections from other namespaces wait");
                self.plain(poller, w)
            }
            Stage::Hello(server) => self.finish(r, poller, w, &server),
        }
        self.arm();
        true
    }

    /// Plain TCP, the stream untouched: out of the poll set and to `ready`.
    fn plain(&mut self, poller: &Poller, w: Waiting) {
        let _ = poller.delete(&w.tcp);
        self.deliver_tcp(w);
    }

    fn deliver_tcp(&mut self, mut w: Waiting) {
        w.lower();
        self.ready.push_back((Resolved::Tcp(w.tcp), w.peer));
    }

    /// Arms the timer for the earliest deadline or look (disarmed when nothing waits).
    fn arm(&self) {
        let next = self.waiting.iter().map(Waiting::next_look).min();
        // If arming fails, the next poll report or accept looks again.
        let _ = colo_sys::timer::arm(&self.timer, next.map(|t| t.saturating_duration_since(Instant::now())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// Three connections wait at once: one silent, one that proposes and never sends its HELLO,
    /// one that opens with other bytes. The last is handed over first, its bytes intact; the
    /// proposer is answered ACCEPT meanwhile; the other two follow as plain TCP when their waits
    /// end, on the timer alone (no other event comes). Watchdog: 20 s in all.
    #[test]
    fn each_connection_waits_for_itself_only() {
        let dir = std::env::temp_dir().join(format!("colo-netns-accept-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r = Rendezvous::for_test(&dir, "colo-6-6");
        let poller = Poller::new().unwrap();
        let mut a = NetnsAccepts::new(&poller, 7).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let silent = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let mut proposer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let mut speaker = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        proposer.write_all(&netns::proposal(&netns::boot_id().unwrap(), &[1; 8])).unwrap();
        speaker.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        for _ in 0..3 {
            let (s, peer) = l.accept().unwrap();
            s.set_nonblocking(true).unwrap();
            a.admit(s, peer, &poller).unwrap();
        }
        let port = |s: &TcpStream| s.local_addr().unwrap().port();
        let (silent_port, proposer_port, speaker_port) = (port(&silent), port(&proposer), port(&speaker));
        let watchdog = Instant::now() + Duration::from_secs(20);
        let mut order = Vec::new();
        while order.len() < 3 {
            assert!(Instant::now() < watchdog, "resolved only {order:?}");
            // Only what the poll set reports wakes this loop, as a blocking accept waits.
            let _ = poller.wait(Some(Duration::from_secs(5))).unwrap();
            a.step(&r, &poller);
            while let Some((s, peer)) = a.pop() {
                let Resolved::Tcp(mut s) = s else { panic!("{peer}: on shared memory") };
                s.set_nonblocking(false).unwrap();
                if peer.port() == speaker_port {
                    let mut b = [0u8; 18];
                    s.read_exact(&mut b).unwrap();
                    assert_eq!(&b, b"GET / HTTP/1.0\r\n\r\n", "the stream as the client sent it");
                }
                order.push(peer.port());
            }
        }
        assert_eq!(order[0], speaker_port, "a connection that opened with other bytes waited for the others");
        order.sort();
        let mut want = vec![silent_port, proposer_port, speaker_port];
        want.sort();
        assert_eq!(order, want);
        let mut answer = [0u8; netns::ANSWER_LEN];
        proposer.read_exact(&mut answer).unwrap();
        assert_eq!((&answer[..8], answer[8]), (&netns::MAGIC[..], 2), "the proposal was answered ACCEPT");
        drop((silent, r));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Clients that stopped waiting for the answer and went on over plain TCP (spec/WIRE.md
    /// section 11, step 3): one whose bytes already follow its PROPOSAL is answered DECLINE, one
    /// that sends bytes after its ACCEPT instead of the HELLO ends its wait. Both reach the
    /// application before a proposer admitted first that sends nothing after its PROPOSAL (whose
    /// wait ends only with the HELLO wait), each with its bytes intact. Watchdog: 20 s.
    #[test]
    fn a_client_that_went_on_is_handed_over_at_once() {
        let dir = std::env::temp_dir().join(format!("colo-netns-went-on-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r = Rendezvous::for_test(&dir, "colo-8-8");
        let poller = Poller::new().unwrap();
        let mut a = NetnsAccepts::new(&poller, 7).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let proposal = netns::proposal(&netns::boot_id().unwrap(), &[3; 8]);
        let mut waiter = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let mut late = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let mut behind = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        waiter.write_all(&proposal).unwrap();
        late.write_all(&proposal).unwrap();
        behind.write_all(&[&proposal[..], b"PING\r\n"].concat()).unwrap();
        for _ in 0..3 {
            let (s, peer) = l.accept().unwrap();
            s.set_nonblocking(true).unwrap();
            a.admit(s, peer, &poller).unwrap();
        }
        let port = |s: &TcpStream| s.local_addr().unwrap().port();
        let (waiter_port, late_port, behind_port) = (port(&waiter), port(&late), port(&behind));
        let watchdog = Instant::now() + Duration::from_secs(20);
        let mut order = Vec::new();
        let mut answered = false;
        while order.len() < 3 {
            assert!(Instant::now() < watchdog, "resolved only {order:?}");
            let _ = poller.wait(Some(Duration::from_secs(5))).unwrap();
            a.step(&r, &poller);
            if !answered && a.waiting.iter().all(|w| matches!(w.stage, Stage::Hello(_))) && a.waiting.len() == 2 {
                // Both proposers have their ACCEPT: `late` goes on without its HELLO.
                late.write_all(b"QUIT\r\n").unwrap();
                answered = true;
            }
            while let Some((s, peer)) = a.pop() {
                let Resolved::Tcp(mut s) = s else { panic!("{peer}: on shared memory") };
                s.set_nonblocking(false).unwrap();
                let want: &[u8] = if peer.port() == late_port { b"QUIT\r\n" } else { b"PING\r\n" };
                if peer.port() != waiter_port {
                    let mut b = [0u8; 6];
                    s.read_exact(&mut b).unwrap();
                    assert_eq!(&b, want, "the stream after the PROPOSAL as the client sent it");
                }
                order.push(peer.port());
            }
        }
        assert_eq!(order, vec![behind_port, late_port, waiter_port]);
        let mut answer = [0u8; netns::ANSWER_LEN];
        behind.read_exact(&mut answer).unwrap();
        assert_eq!((&answer[..8], answer[8]), (&netns::MAGIC[..], 3), "a PROPOSAL with bytes behind it is declined");
        for s in [&mut waiter, &mut late] {
            s.read_exact(&mut answer).unwrap();
            assert_eq!(answer[8], 2, "a PROPOSAL alone is accepted");
        }
        drop(r);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A full set pushes out its oldest connection still waiting for first bytes before one
    /// waiting for its HELLO (older though that is), each as plain TCP with its stream as sent
    /// (the proposer's PROPOSAL consumed, its ACCEPT answered). Watchdog: the sockets' 10 s
    /// timeouts.
    #[test]
    fn a_full_set_pushes_out_the_oldest_silent_first() {
        let dir = std::env::temp_dir().join(format!("colo-netns-evict-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r = Rendezvous::for_test(&dir, "colo-7-7");
        let poller = Poller::new().unwrap();
        let mut a = NetnsAccepts::new(&poller, 7).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut proposer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        proposer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        proposer.write_all(&netns::proposal(&netns::boot_id().unwrap(), &[2; 8])).unwrap();
        let (s, peer) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        a.admit(s, peer, &poller).unwrap();
        let mut answer = [0u8; netns::ANSWER_LEN];
        // Answered at a step once its PROPOSAL is there.
        proposer.set_nonblocking(true).unwrap();
        let watchdog = Instant::now() + Duration::from_secs(10);
        loop {
            a.step(&r, &poller);
            if proposer.peek(&mut answer[..1]).is_ok() {
                break;
            }
            assert!(Instant::now() < watchdog, "the PROPOSAL was not answered");
            std::thread::sleep(Duration::from_millis(1));
        }
        proposer.set_nonblocking(false).unwrap();
        proposer.read_exact(&mut answer).unwrap();
        assert_eq!(answer[8], 2, "answered ACCEPT");
        let mut silent = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, silent_peer) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        a.admit(s, silent_peer, &poller).unwrap();
        assert!(a.evict_oldest(&r, &poller));
        let (first, p1) = a.pop().unwrap();
        assert_eq!(p1, silent_peer, "the connection still waiting for first bytes went first");
        let Resolved::Tcp(mut first) = first else { panic!("on shared memory") };
        assert!(a.evict_oldest(&r, &poller));
        let (second, p2) = a.pop().unwrap();
        assert_eq!(p2, peer);
        let Resolved::Tcp(mut second) = second else { panic!("on shared memory") };
        assert!(!a.evict_oldest(&r, &poller), "nothing left to push out");
        // Both streams are plain TCP from here, byte-exact both ways.
        for (server, client) in [(&mut first, &mut silent), (&mut second, &mut proposer)] {
            server.set_nonblocking(false).unwrap();
            server.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            client.write_all(b"ping").unwrap();
            let mut b = [0u8; 4];
            server.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"ping");
            server.write_all(b"pong").unwrap();
            client.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            client.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"pong");
        }
        drop(r);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A fork child's copy of a set lets go of its connections, waiting and ready: the
    /// clients of those it held see their end once no other copy holds them (here, none), and
    /// the poll set keeps its registrations (the parent's, in a fork). Watchdog: 10 s reads.
    #[test]
    fn a_set_let_go_closes_what_it_holds() {
        let dir = std::env::temp_dir().join(format!("colo-netns-let-go-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r = Rendezvous::for_test(&dir, "colo-9-9");
        let poller = Poller::new().unwrap();
        let mut a = NetnsAccepts::new(&poller, 7).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut silent = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let mut speaker = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        speaker.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut accepted = Vec::new();
        for _ in 0..2 {
            let (s, peer) = l.accept().unwrap();
            s.set_nonblocking(true).unwrap();
            accepted.push((s, peer));
        }
        let (held_silent, held_speaker) = if accepted[0].1 == silent.local_addr().unwrap() {
            (accepted.remove(0), accepted.remove(0))
        } else {
            (accepted.remove(1), accepted.remove(0))
        };
        // The speaker's connection is resolved (plain TCP) and ready.
        a.admit(held_speaker.0, held_speaker.1, &poller).unwrap();
        let watchdog = Instant::now() + Duration::from_secs(10);
        while !a.has_ready() {
            assert!(Instant::now() < watchdog, "the speaker was never resolved");
            let _ = poller.wait(Some(Duration::from_millis(100))).unwrap();
            a.step(&r, &poller);
        }
        // The silent one waits (its deadline is not looked at before the next step).
        a.admit(held_silent.0, held_silent.1, &poller).unwrap();
        assert_eq!(a.waiting(), 1);
        a.let_go();
        assert_eq!((a.waiting(), a.has_ready()), (0, false));
        for c in [&mut silent, &mut speaker] {
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut b = [0u8; 8];
            // The end of stream, or a reset where the client's request was left unread.
            let ended = match c.read(&mut b) {
                Ok(n) => n == 0,
                Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            };
            assert!(ended, "the client saw no end of its connection");
        }
        drop(r);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn rcvlowat(s: &TcpStream) -> i32 {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: an open socket; `v` and `len` are ours, `len` its size.
        let r = unsafe { libc::getsockopt(std::os::fd::AsRawFd::as_raw_fd(s), libc::SOL_SOCKET, libc::SO_RCVLOWAT, std::ptr::from_mut(&mut v).cast(), &mut len) };
        assert_eq!(r, 0);
        v
    }

    /// The start of a PROPOSAL wakes the wait only when more bytes come, or the stream ends, or
    /// at its deadline; not every millisecond until then. Three connections open with the first
    /// 20 bytes of a PROPOSAL: one then ends its stream (plain TCP at the next look, its bytes
    /// as sent), one sends the rest in two parts (answered ACCEPT), one stays silent (plain TCP
    /// at its deadline). The poll set reports a handful of times in all, where a look every
    /// millisecond until the 50 ms deadline reported about fifty. The sockets handed on have
    /// their `SO_RCVLOWAT` back at 1. Watchdog: 20 s.
    #[test]
    fn a_partial_proposal_wakes_the_wait_only_when_bytes_come() {
        let dir = std::env::temp_dir().join(format!("colo-netns-partial-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r = Rendezvous::for_test(&dir, "colo-8-8");
        let poller = Poller::new().unwrap();
        let mut a = NetnsAccepts::new(&poller, 7).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let proposal = netns::proposal(&netns::boot_id().unwrap(), &[3; 8]);
        let mut clients = Vec::new();
        for _ in 0..3 {
            let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            c.write_all(&proposal[..20]).unwrap();
            let (s, peer) = l.accept().unwrap();
            s.set_nonblocking(true).unwrap();
            a.admit(s, peer, &poller).unwrap();
            clients.push((c, peer));
        }
        let (ender, grower, silent) = (clients[0].1, clients[1].1, clients[2].1);
        clients[0].0.shutdown(std::net::Shutdown::Write).unwrap();
        let watchdog = Instant::now() + Duration::from_secs(20);
        let (mut reports, mut sent, mut order) = (0, 20, Vec::new());
        while order.len() < 2 {
            assert!(Instant::now() < watchdog, "resolved only {order:?}");
            if !poller.wait(Some(Duration::from_secs(5))).unwrap().is_empty() {
                reports += 1;
            }
            a.step(&r, &poller);
            // The grower sends the rest in two parts, each after a report.
            if sent < PROPOSAL_LEN {
                let next = (sent + 40).min(PROPOSAL_LEN);
                clients[1].0.write_all(&proposal[sent..next]).unwrap();
                sent = next;
            }
            while let Some((res, peer)) = a.pop() {
                let Resolved::Tcp(mut s) = res else { panic!("{peer}: on shared memory") };
                assert_eq!(rcvlowat(&s), 1, "{peer}: SO_RCVLOWAT as the application expects it");
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut b = [0u8; 20];
                s.read_exact(&mut b).unwrap();
                assert_eq!(b[..], proposal[..20], "{peer}: the stream as the client sent it");
                order.push(peer);
            }
        }
        assert_eq!(order, vec![ender, silent], "the ended stream went at once, the silent one at its deadline");
        assert!(reports <= 8, "the poll set reported {reports} times (a look every millisecond?)");
        let mut answer = [0u8; netns::ANSWER_LEN];
        clients[1].0.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        clients[1].0.read_exact(&mut answer).unwrap();
        assert_eq!((&answer[..8], answer[8]), (&netns::MAGIC[..], 2), "{grower}: its PROPOSAL, sent in parts, was answered ACCEPT");
        drop(r);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
