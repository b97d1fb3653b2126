//! Tests of the sleep protocol and of the message slots' bookkeeping, which look inside a side.

use super::Shm;
use crate::{Listener, Options, SpinMode, Stream};
use colo_ring::notify;
use std::cell::Cell;
use std::io::{Read, Write};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

/// A thread of one side announces a sleep and has re-checked (nothing yet); the peer's
/// wake-up comes before it sleeps (so nobody is woken); then `meanwhile` runs on this side,
/// and the other half of the side (a reader) goes to sleep first. The first thread must look
/// at its condition again instead of waiting behind the reader for a wake-up that is not
/// coming (a writer with space in its ring would wait for ever behind a reader that waits for
/// the echo of bytes the writer has not written yet).
fn first_thread_looks_again(meanwhile: impl FnOnce(&Shm)) {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let opts = Options::new().spin(SpinMode::Never);
    let a = Stream::connect_with(l.local_addr().unwrap(), &opts).unwrap();
    let (b, _) = l.accept().unwrap();
    let (sa, sb) = (a.shm().unwrap(), b.shm().unwrap());
    let read_one = || {
        let mut byte = [0u8; 1];
        (&a).read(&mut byte).map(|n| (n, byte[0]))
    };
    let until_asleep = || {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !super::lock(&sa.waiters).leader {
            assert!(Instant::now() < deadline, "the reader never went to sleep");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    std::thread::scope(|s| {
        // A first sleep sets up how later ones sleep (the hang-up watcher), and may wake once.
        let warm = s.spawn(read_one);
        until_asleep();
        std::thread::sleep(Duration::from_millis(20));
        (&b).write_all(&[1]).unwrap();
        assert_eq!(warm.join().unwrap().unwrap(), (1, 1));

        // The first thread reads the epoch and announces (and has re-checked: nothing yet).
        let seen = Cell::new(super::lock(&sa.waiters).epoch);
        sa.announce(notify::SLEEP_FUTEX, Some(&seen));
        // The peer makes progress and takes the announcement: nobody is asleep.
        sb.wake_peer();
        meanwhile(sa);
        // The other half reads (nothing to read) and becomes the sleeping leader.
        let reader = s.spawn(read_one);
        until_asleep();
        // The first thread now sleeps: it must come back to look again, not wait.
        let (done, returned) = channel();
        s.spawn(move || {
            let wake = super::wait::Registered::new(sa);
            wake.register();
            done.send(sa.block(None, None, seen.get(), &wake).is_ok()).unwrap()
        });
        let looked_again = returned.recv_timeout(Duration::from_secs(5));
        // Either way, end the reader's sleep (and a stuck first thread's with it).
        (&b).write_all(&[7]).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), (1, 7));
        assert_eq!(looked_again, Ok(true), "the first thread slept through the wake-up it had lost");
    });
}

/// A thread announces a doorbell sleep (its wake-up eventfd registered), the peer rings,
/// and another thread of the side empties the doorbell before the first sleeps (a
/// non-blocking call's drain): the first must be woken through its own eventfd, not sleep
/// on with its ring taken (as an `epoll_wait` reader would, behind a writer thread of its own).
#[test]
fn a_ring_another_thread_empties_reaches_the_sleeper_through_its_own_eventfd() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let a = Stream::connect_with(l.local_addr().unwrap(), &Options::new().spin(SpinMode::Never)).unwrap();
    let (b, _) = l.accept().unwrap();
    let (sa, sb) = (a.shm().unwrap(), b.shm().unwrap());
    // The server's welcome on the control socket would end the sleep: take it now.
    sa.poll_control();
    let wake = crate::wake::own_fd().unwrap();
    let registered = super::wait::Registered::new(sa);
    assert!(sa.add_waker(wake));
    registered.fd.set(Some(wake));
    let seen = Cell::new(super::lock(&sa.waiters).epoch);
    sa.announce(notify::SLEEP_DOORBELL, Some(&seen));
    sb.wake_peer();
    std::thread::scope(|s| {
        assert!(s.spawn(|| sa.drain_doorbell(super::Drainer::Awake)).join().unwrap(), "the peer rang");
        let (done, returned) = channel();
        let deadline = Instant::now() + Duration::from_secs(3600);
        s.spawn(move || done.send(sa.block(Some(deadline), None, seen.get(), &registered).is_ok()).unwrap());
        let woken = returned.recv_timeout(Duration::from_secs(5));
        // Either way, end the sleep (a stuck one's too).
        colo_sys::doorbell::ring(&sa.fds.self_bell);
        assert_eq!(woken, Ok(true), "the sleeper slept through the ring another thread took");
    });
}

/// The threads waiting on one epoll set register the set's eventfd: it takes one place
/// however many they are, and stays until the last of them removes it.
#[test]
fn an_eventfd_many_sleepers_register_takes_one_place() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let a = Stream::connect(l.local_addr().unwrap()).unwrap();
    let sa = a.shm().unwrap();
    // (Numbers only: nothing drains this side's doorbell while they are registered.)
    let (set, others) = (20_000, 20_001..20_008);
    for _ in 0..20 {
        assert!(sa.add_waker(set));
    }
    for fd in others.clone() {
        assert!(sa.add_waker(fd));
    }
    assert!(!sa.add_waker(20_008), "all places are taken");
    for _ in 0..19 {
        sa.remove_waker(set);
    }
    assert!(!sa.add_waker(20_008), "one sleeper on the set is left");
    sa.remove_waker(set);
    assert!(sa.add_waker(20_008), "the last one's removal freed the place");
    for fd in others.chain([20_008]) {
        sa.remove_waker(fd);
    }
    assert!(sa.wakers.iter().all(|w| w.load(std::sync::atomic::Ordering::Relaxed) == 0));
}

/// A peer that sends again a slot this side still holds (received, not yet released) is
/// caught as corrupt, and only that; a slot released and then sent again is a new message.
#[test]
fn a_slot_sent_again_while_held_is_corruption_and_once_released_is_not() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let a = Stream::connect_with(l.local_addr().unwrap(), &Options::new().pool(64, 2)).unwrap();
    let (b, _) = l.accept().unwrap();
    let (sa, sb) = (a.shm().unwrap(), b.shm().unwrap());
    // Sends `slot` as the peer's queue would carry it, whatever the sender's own books say.
    let send_raw_entry = |slot: u32| {
        let mut tx = super::lock(&sa.msgs.as_ref().unwrap().tx);
        tx.msgs.push([slot, 8]).unwrap();
    };
    let (slot, _) = sa.loan(8).unwrap();
    sa.send_slot(slot, 8).unwrap();
    let (got, _, len) = sb.recv_message().unwrap().unwrap();
    assert_eq!((got, len), (slot, 8));
    // Released, then sent again (as a peer reusing the slot does): fine.
    sb.release(got);
    send_raw_entry(slot);
    let (again, _, _) = sb.recv_message().unwrap().unwrap();
    assert_eq!(again, slot);
    // Sent again while still held: the receiver reports corruption.
    send_raw_entry(slot);
    let e = sb.recv_message().unwrap_err();
    assert_eq!(crate::errno_of(&e), 71, "EPROTO, got {e:?}");
    assert!(e.to_string().contains("still hold"), "{e}");
}

/// The reader's own announcement finds the word woken.
#[test]
fn a_wake_up_taken_before_the_sleep_is_not_lost_behind_the_other_half() {
    first_thread_looks_again(|_| {});
}

/// A third announcement finds the word woken and its look then succeeds (or it was a
/// non-blocking call's): it does not sleep, and the reader's announcement after it is not
/// fresh. The fresh one must still send the first thread round.
#[test]
fn a_fresh_announcement_whose_look_succeeded_still_sends_the_others_round() {
    first_thread_looks_again(|sa| {
        sa.announce(notify::SLEEP_DOORBELL, None);
    });
}

/// A non-blocking reader that misses after its peer hung up (no FIN: the peer's processes are
/// gone), before the hang-up watcher has seen it, is told `EAGAIN` (the miss reads the control
/// socket only when the watcher's mark is set); the watcher then rings the self bell, a new
/// edge on the readiness fd for an edge-triggered waiter that consumed the hang-up's own edge,
/// and the next read reports the reset.
#[test]
fn a_hang_up_the_watcher_sees_late_is_a_new_edge_and_the_next_read_reports_it() {
    use colo_sys::AsRawFd;
    let (tx, rx) = channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(60)) {
            eprintln!("watchdog: the test hung");
            std::process::abort();
        }
    });
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let a = Stream::connect_with(l.local_addr().unwrap(), &Options::new().spin(SpinMode::Never)).unwrap();
    let (b, _) = l.accept().unwrap();
    let (sa, sb) = (a.shm().unwrap(), b.shm().unwrap());
    a.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    // The first miss registers the connection with the watcher.
    assert_eq!((&a).read(&mut byte).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    assert!(sa.watched(), "a watcher runs in a test process");
    // SAFETY: plain system calls on descriptors this test owns; `set` is closed at the end.
    let set = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(set >= 0);
    let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLET) as u32, u64: 1 };
    // SAFETY: as above; `ev` is a valid event for the call.
    assert_eq!(unsafe { libc::epoll_ctl(set, libc::EPOLL_CTL_ADD, sa.readiness_fd().as_raw_fd(), &mut ev) }, 0);
    let wait = |ms: i32| {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: `evs` holds 4 events.
        let n = unsafe { libc::epoll_wait(set, evs.as_mut_ptr(), 4, ms) };
        assert!(n >= 0, "epoll_wait: {}", std::io::Error::last_os_error());
        n
    };
    assert_eq!(wait(0), 0, "nothing to report yet");
    {
        // The watcher cannot mark the connection while this is held.
        let _held = crate::hangup::hold();
        // The peer's processes are gone: its control socket closes, no FIN in the ring.
        // SAFETY: the peer's control socket, open while `b` lives.
        assert_eq!(unsafe { libc::shutdown(sb.control_fd().as_raw_fd(), libc::SHUT_RDWR) }, 0);
        // The hang-up's own edge, consumed as an edge-triggered waiter would, whose read then
        // finds nothing to say yet.
        let deadline = Instant::now() + Duration::from_secs(10);
        while wait(10) == 0 {
            assert!(Instant::now() < deadline, "the hang-up made the readiness fd readable");
        }
        assert_eq!((&a).read(&mut byte).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
        assert_eq!(wait(0), 0, "no edge since");
    }
    // The watcher marks the connection and rings its self bell: a new edge.
    assert_eq!(wait(10_000), 1, "the watcher made a new edge on the readiness fd");
    let err = (&a).read(&mut byte).expect_err("the hang-up is reported");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    // SAFETY: the test's own epoll set, not used after this.
    unsafe { libc::close(set) };
    tx.send(()).unwrap();
}

/// A forked child's copy of a non-blocking connection the parent had registered with its
/// hang-up watcher is watched by a watcher of the child's own (the parent's thread is not in
/// the child): the child's reads are told of the peer's hang-up, not `EAGAIN` for ever.
#[test]
fn a_forked_child_watches_its_copy_of_a_connection_for_itself() {
    use colo_sys::AsRawFd;
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let a = Stream::connect_with(l.local_addr().unwrap(), &Options::new().spin(SpinMode::Never)).unwrap();
    let (b, _) = l.accept().unwrap();
    a.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    // Two misses: the first registers the connection with this process's watcher, the second
    // takes its word for the control socket.
    for _ in 0..2 {
        assert_eq!((&a).read(&mut byte).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    }
    assert!(a.shm().unwrap().hangup.watching());
    let mut pipe = [0; 2];
    // SAFETY: a pipe for the child to say it is ready.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    // SAFETY: the child uses this crate (whose fork handlers make its locks safe to take) and
    // leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let mut a = &a;
        let code = (|| {
            for _ in 0..2 {
                if a.read(&mut byte).map_err(|e| e.kind()) != Err(std::io::ErrorKind::WouldBlock) {
                    return 2;
                }
            }
            // SAFETY: the pipe's write end.
            unsafe { libc::write(pipe[1], b"r".as_ptr().cast(), 1) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                match a.read(&mut byte) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(2)),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return 0,
                    _ => return 3,
                }
            }
            1
        })();
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    assert!(pid > 0);
    // SAFETY: the pipe's read end; waits for the child's byte (the child exits 2 or 3 on a
    // wrong answer, closing its end: the read then returns 0).
    let got = unsafe { libc::read(pipe[0], byte.as_mut_ptr().cast(), 1) };
    // The peer's processes are gone: its control socket shut for every holder (the child holds
    // a copy of it too), no FIN in the ring.
    // SAFETY: the peer's control socket, open while `b` lives.
    assert_eq!(unsafe { libc::shutdown(b.shm().unwrap().control_fd().as_raw_fd(), libc::SHUT_RDWR) }, 0);
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    // SAFETY: the pipe's ends, not used after this.
    unsafe {
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
    assert_eq!(got, 1, "the child's first misses were EAGAIN");
    assert!(libc::WIFEXITED(status), "child status {status}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "the child was told of the hang-up (1: EAGAIN for 20 s)");
}

/// A relay's reads: `peek_at` copies the bytes past those it handed on already (none yet: `None`;
/// end of stream once nothing lies past them after FIN), and `release_peeked` takes bytes off the
/// ring later, waking a writer that waits for space as a read does.
#[test]
fn peeking_ahead_then_releasing_wakes_a_writer_waiting_for_space() {
    const CAP: usize = 64 * 1024;
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let opts = Options::new().spin(SpinMode::Never).ring_capacity(CAP as u32);
    let a = Stream::connect_with(l.local_addr().unwrap(), &opts).unwrap();
    let (b, _) = l.accept().unwrap();
    let (sa, sb) = (a.shm().unwrap(), b.shm().unwrap());
    let data: Vec<u8> = (0..2 * CAP).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut buf = vec![0u8; 2 * CAP];
    assert!(sa.peek_at(0, &mut buf).unwrap().is_none());
    let (done, wrote) = channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            (&b).write_all(&data).unwrap();
            sb.shutdown(false, true);
            done.send(()).unwrap();
        });
        // The ring fills (the writer then waits): every byte peeked, none released.
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while got < CAP {
            assert!(Instant::now() < deadline, "the ring never filled");
            match sa.peek_at(got, &mut buf[got..]).unwrap() {
                Some(n) => got += n,
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        assert_eq!(&buf[..CAP], &data[..CAP]);
        assert!(sa.peek_at(CAP, &mut buf[CAP..]).unwrap().is_none());
        assert!(wrote.recv_timeout(Duration::from_millis(100)).is_err(), "the writer waits for space");
        // Released later: the writer goes on, and the next bytes are past what is left.
        assert_eq!(sa.release_peeked(CAP).unwrap(), CAP);
        wrote.recv_timeout(Duration::from_secs(10)).expect("the release woke the writer");
        let mut got = 0;
        while got < CAP {
            got += sa.peek_at(got, &mut buf[got..CAP]).unwrap().expect("bytes before FIN");
        }
        assert_eq!(&buf[..CAP], &data[CAP..]);
        assert_eq!(sa.peek_at(CAP, &mut buf).unwrap(), Some(0), "end of stream past the last byte");
        assert_eq!(sa.release_peeked(2 * CAP).unwrap(), CAP, "a release takes at most the unread bytes");
    });
}

/// A read or write that already waited for something else (the LD_PRELOAD shim's turn between
/// processes sharing a connection) counts its timeout from when the call began:
/// `read_since`/`write_since` whose timeout was spent before they start give up at their first
/// wait (`WouldBlock`), where `read`/`write` would wait the whole timeout again.
#[test]
fn a_timeout_spent_before_the_wait_ends_it_at_once() {
    const TIMEOUT: Duration = Duration::from_secs(10);
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let opts = Options::new().spin(SpinMode::Never).ring_capacity(64 * 1024);
    let a = Stream::connect_with(l.local_addr().unwrap(), &opts).unwrap();
    let (_b, _) = l.accept().unwrap();
    let sa = a.shm().unwrap();
    sa.set_read_timeout(Some(TIMEOUT));
    sa.set_write_timeout(Some(TIMEOUT));
    // The ring full (nobody reads it).
    sa.set_nonblocking(true);
    let chunk = [7u8; 4096];
    while sa.write(&chunk).is_ok() {}
    sa.set_nonblocking(false);
    let spent = Instant::now().checked_sub(TIMEOUT).expect("the host has been up longer than the timeout");
    let (done, ended) = channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut buf = [0u8; 16];
            let read = sa.read_since(&mut buf, Some(spent)).map_err(|e| e.kind());
            let wrote = sa.write_since(&chunk, Some(spent)).map_err(|e| e.kind());
            let _ = done.send((read, wrote));
        });
        // The watchdog: a third of the timeout.
        let (read, wrote) = ended.recv_timeout(TIMEOUT / 3).expect("the read and the write gave up before the timeout ran again");
        assert_eq!(read, Err(std::io::ErrorKind::WouldBlock));
        assert_eq!(wrote, Err(std::io::ErrorKind::WouldBlock));
    });
}

/// Both ends of a DIRECT connection refuse descriptors (spec/WIRE.md section 6: the client's
/// control socket from the start, the server's once the HELLO is read).
#[test]
fn both_ends_of_a_direct_connection_refuse_descriptors() {
    let (x, _y) = std::os::unix::net::UnixStream::pair().unwrap();
    if !colo_sys::gift::refuse_rights(&x) {
        return; // a kernel before 6.16
    }
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let a = Stream::connect_with(l.local_addr().unwrap(), &Options::new().spin(SpinMode::Never)).unwrap();
    let (b, _) = l.accept().unwrap();
    assert!(!colo_sys::gift::rights_on(b.shm().unwrap().control_fd()), "the server's end takes descriptors");
    assert!(!colo_sys::gift::rights_on(a.shm().unwrap().control_fd()), "the client's end takes descriptors");
}

/// A pending client (the answer still due) with two threads: one takes the late WELCOME off
/// the control socket, and before it has recorded it, the server rings (it may, once its
/// WELCOME is sent) and the other thread looks at the control socket (`poll_control`, as a
/// non-blocking miss does). The ring is a ring, not a reset.
#[test]
fn a_ring_right_behind_the_late_welcome_is_no_reset() {
    use colo_sys::doorbell::{self, Datagram};
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let a = Stream::connect_with(l.local_addr().unwrap(), &Options::new().spin(SpinMode::Never)).unwrap();
    let sa = a.shm().unwrap();
    assert!(sa.has(super::AWAITING_WELCOME), "the dial waited for its answer");
    let (b, _) = l.accept().unwrap();
    let sb = b.shm().unwrap();
    // The first thread's receive (`drain_doorbell`'s), not yet acted on.
    assert!(matches!(doorbell::take_one(sa.control_fd()), Datagram::Message(_)));
    doorbell::ring_peer(sb.control_fd());
    // The second thread's look.
    sa.poll_control();
    assert!(!sa.has(super::RESET | super::PEER_GONE), "a ring behind the WELCOME reset the connection");
}

/// Bytes the peer's closer let go unread (DROPPED, spec/WIRE.md section 8, "Orphaned bytes")
/// are lost: a read after this side's own read shutdown reports the loss as a reset, as the
/// read before it would, never as an end of stream.
#[test]
fn a_read_after_a_read_shutdown_reports_dropped_bytes_as_a_reset() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let opts = Options::new().spin(SpinMode::Never);
    let a = Stream::connect_with(l.local_addr().unwrap(), &opts).unwrap();
    let (b, _) = l.accept().unwrap();
    let (sa, sb) = (a.shm().unwrap(), b.shm().unwrap());
    (&b).write_all(&[5; 100]).unwrap();
    sa.shutdown_as_tcp(true, false);
    sb.out_words.raise_flags(colo_ring::layout::FLAG_RESET | colo_ring::layout::FLAG_DROPPED);
    let mut buf = [0u8; 100];
    let err = (&a).read(&mut buf).expect_err("the dropped bytes read as an end of stream");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
}

/// The self bell kept rung for level-triggered pollers (`keep_self_rung`) is rung once until a
/// drain empties it, whatever the reads in between; a drain empties it with the peer's ring,
/// and the next keep rings again (an edge for the pollers after that drain).
#[test]
fn a_kept_self_ring_is_rung_once_until_drained() {
    let l = Listener::bind("127.0.0.1:0").unwrap();
    let opts = Options::new().spin(SpinMode::Never);
    let a = Stream::connect_with(l.local_addr().unwrap(), &opts).unwrap();
    let (b, _) = l.accept().unwrap();
    let (sa, sb) = (a.shm().unwrap(), b.shm().unwrap());
    sa.poll_control();
    // What the self bell holds, emptied (its count).
    let bell = std::fs::File::from(sa.fds.self_bell.try_clone().unwrap());
    let count = || {
        let mut buf = [0u8; 8];
        match (&bell).read(&mut buf) {
            Ok(8) => u64::from_ne_bytes(buf),
            _ => 0,
        }
    };
    for _ in 0..100 {
        sa.keep_self_rung();
    }
    assert_eq!(count(), 1, "a hundred keeps, one ring");
    // Emptied behind its back (another process's drain): the flag still stands, and the next
    // drain of this side clears it.
    sa.keep_self_rung();
    assert_eq!(count(), 0, "still kept: no ring");
    assert!(!sa.drain_doorbell(super::Drainer::Awake));
    sa.keep_self_rung();
    assert_eq!(count(), 1, "rung again after a drain");
    // The peer rang too: one drain takes both, and the next keep rings again.
    assert!(!sa.drain_doorbell(super::Drainer::Awake));
    sa.keep_self_rung();
    sa.announce(notify::SLEEP_DOORBELL, None);
    sb.wake_peer();
    sa.keep_self_rung();
    assert!(sa.drain_doorbell(super::Drainer::Awake), "the peer's ring");
    assert_eq!(count(), 0, "the kept ring went with the peer's");
    assert!(!sa.drain_doorbell(super::Drainer::Awake), "nothing left in either bell");
    sa.keep_self_rung();
    assert_eq!(count(), 1);
    drop((a, b));
}
