package colo

import "golang.org/x/sys/unix"

// Silent rendezvous connections and the claim's wait (spec/WIRE.md section 3, CARRIER mode,
// step 2). claimCarrier waits a bounded time for HELLOs of rendezvous connections accepted but
// not read yet, since one of them may carry the offer of the TCP connection being accepted. A
// client queues its HELLO before its SYN, so that offer is, by the time its TCP connection is
// accepted, either read already or queued on its control socket. A connection with nothing
// queued is a client that has not spoken (another user may hold such connections for as long
// as helloTimeout): waiting for it would hold up every TCP accept from an odd port.
//
// So a connection whose goroutine found no HELLO (serveHello) is listed as silent while that
// goroutine waits for data, and the claim does not wait for one that still has nothing queued.
// The goroutine's read and its removal from the list happen under silentMu, as does the claim's
// look at the list: a HELLO read is never missed between the two.

// markSilent lists cfd as a connection whose HELLO has not arrived.
func (l *Listener) markSilent(cfd int) {
	l.silentMu.Lock()
	if l.silent == nil {
		l.silent = make(map[int]struct{})
	}
	l.silent[cfd] = struct{}{}
	l.silentMu.Unlock()
}

// readSilent is readHello for a listed connection: once it has read something (a HELLO, an
// error or the end), the connection is no longer listed.
func (l *Listener) readSilent(cfd int, h *hello) bool {
	l.silentMu.Lock()
	defer l.silentMu.Unlock()
	done := readHello(cfd, h, 0)
	if done {
		delete(l.silent, cfd)
	}
	return done
}

// unmarkSilent takes cfd off the list (its wait ended without a read: a deadline or Close).
func (l *Listener) unmarkSilent(cfd int) {
	l.silentMu.Lock()
	delete(l.silent, cfd)
	l.silentMu.Unlock()
}

// unreadHellos is how many accepted rendezvous connections may still carry an offer the claim
// has not seen: those pending, less the silent ones with nothing queued (one poll, no wait).
func (l *Listener) unreadHellos() int32 {
	l.silentMu.Lock()
	defer l.silentMu.Unlock()
	n := l.pending.Load() // SYNC POINT with the Adds in acceptControl and handleHello's heard
	if len(l.silent) == 0 || n <= 0 {
		return n
	}
	fds := make([]unix.PollFd, 0, len(l.silent))
	for fd := range l.silent {
		fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
	if _, err := unix.Poll(fds, 0); err != nil {
		return n // not known: wait for them, as before
	}
	for _, p := range fds {
		if p.Revents == 0 {
			n--
		}
	}
	return n
}
