package colo

// The waker's side of the sleep/wake protocol (spec/WIRE.md section 6), as
// rust/colo-ring/src/notify.rs has it: after progress the peer may wait for, exchange the peer's
// waiting word to 0 and wake it the way the returned bits say. This side's own sleep is in
// wait.go and bellwait.go.

import "sync/atomic"

// Bits of a waiting word (spec section 6): how that side sleeps.
const (
	waitDoorbell = 1 // on its doorbell (the only way this package sleeps)
	waitFutex    = 2 // on a shared futex at the waiting word itself
)

// notifyPeer is called after every store the peer may wait for (spec section 6): it exchanges
// the peer's waiting word to 0 and wakes the peer the way each returned bit says. Every write of
// a waiting word, ours and the peer's, is an atomic read-modify-write, so that either this
// exchange returns the sleeper's bit, or the sleeper's OR comes later and its re-check sees our
// progress (Go's atomics are moreover sequentially consistent).
func (c *Conn) notifyPeer() {
	// SYNC POINT with the peer's OR of its waiting word (its announcement, before its
	// re-check): our progress, stored before this exchange, is seen by that re-check, or this
	// exchange returns the announced bits.
	if w := atomic.SwapUint32(c.peerWaiting, 0); w != 0 {
		c.wakePeer(w)
	}
}

// notifySpace is notifyPeer after the consumer moved ring_tail from old (its new value already
// stored). A producer waits for space only when it found the ring full at its limit, and then
// until the unread bytes are down to its space_wake mark (spec section 6), so the peer's waiting
// word is only worth an exchange, and the doorbell a system call, on the read that crosses that
// mark. A peer that waits for something else (our answer, typically) is left asleep: it is not
// woken once per read, and a writer ahead of us is woken once per half ring, not once per read.
//
// Why no wake-up is lost: a producer that sleeps stored its mark M (when it last grew or
// shrank the ring) and its head H, then ORed its waiting bit, then re-read ring_tail and still
// found more than M unread. Our store of the new tail comes after that re-read (else the
// producer would have seen it), so every store before the re-read, M and H included, precedes
// the loads in spaceWakeCrossed. The tail the re-read returned is old (our previous store) or
// older; for an older one, the consumption that stored old already found H - old > M and, had
// it crossed M, exchanged the word after the producer's OR. So the first consumption after the
// producer's re-check that reaches M sees H - old > M and wakes it.
// The tail store and the loads are sequentially consistent (Go's atomics), and the
// producer's OR is a full barrier between its stores and its tail re-read on every
// architecture Go and the Rust core support (a locked instruction on x86, an acquire-release
// read-modify-write followed by an acquire load on arm64). (Rust, whose loads may be acquire
// only, reads the waiting word with a read-modify-write first: notify.rs peer_needs_space_wake.)
func (c *Conn) notifySpace(old uint64) {
	if c.rx.spaceWakeCrossed(&c.in, old) {
		c.notifyPeer()
	}
}

// releaseSpaceWaiter is called right after we announced a sleep (we pause): it wakes a peer
// waiting for space our reads freed but did not wake it for, as they stayed above its space_wake
// mark (spec section 6, "Waiting for space"). Our announcement comes first, so a producer that
// announces after this look sees our bit in its re-check and writes what it can.
func (c *Conn) releaseSpaceWaiter() {
	// SYNC POINT with the peer's announcement (sequentially consistent, as our OR before it).
	if atomic.LoadUint32(c.peerWaiting)&(waitDoorbell|waitFutex) == 0 {
		return
	}
	mark := uint64(atomic.LoadUint32(c.in.spaceWake))
	size := uint64(atomic.LoadUint32(c.in.size))
	// SYNC POINT with the store of ring_head in the peer's producer.write.
	used := atomic.LoadUint64(c.in.head) - atomic.LoadUint64(c.in.tail)
	if mark != 0 && used > mark && used < size {
		c.notifyPeer()
	}
}

// wakePeer wakes the peer for the waiting bits w.
func (c *Conn) wakePeer(w uint32) {
	if w&waitFutex != 0 {
		futexWake(c.peerWaiting)
	}
	// Bits 8 and up are the sleeper's announcement sequence (spec section 6): not a way to sleep.
	if w&waitDoorbell != 0 {
		ringBell(c.ctlFd)
	}
}

// alertPeer wakes the peer after closing or resetting, which are progress like any other (spec
// section 6): the exchange wakes a peer that announced a sleep (one that announced a futex sleep
// but has not entered it finds its word changed), and a peer that announces later sees the flag
// in its re-check. A close wakes no one who is not asleep.
func (c *Conn) alertPeer() {
	// SYNC POINT with the peer's OR of its waiting word, as in notifyPeer; the flag stored
	// before this call is the progress.
	c.wakePeer(atomic.SwapUint32(c.peerWaiting, 0))
}
