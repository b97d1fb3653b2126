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
// stored). A producer waits for space only when it found the ring full (every implementation:
// Go's Write, Rust's write and the shim's EPOLLOUT, which like Linux TCP reports no new
// writability edge for a ring that was not full), so the peer's waiting word is only worth an
// exchange, and the doorbell a system call, when the ring may have been full at old. A peer that
// waits for something else (our answer, typically) is left asleep: it is not woken once per read.
//
// Why no wake-up is lost: a producer that sleeps stored its head H, then ORed its waiting bit,
// then re-read ring_tail and still found H - tail == capacity. Our store of the new tail comes
// after that re-read (else the producer would have seen it), so every head store before the
// re-read, H included, precedes the load in wasFullBefore: it returns at least H. Whichever tail
// the re-read returned is old (our previous store) or older; for an older one, the consumption
// that stored old already found the ring full and exchanged the word after the producer's OR. So
// the first consumption after a producer's re-check sees head - old >= capacity and wakes it.
// The tail store and the head load are sequentially consistent (Go's atomics), and the
// producer's OR is a full barrier between its head store and its tail re-read on every
// architecture Go and the Rust core support (a locked instruction on x86, an acquire-release
// read-modify-write followed by an acquire load on arm64). (Rust, whose loads may be acquire
// only, reads the waiting word with a read-modify-write first: notify.rs peer_needs_space_wake.)
func (c *Conn) notifySpace(old uint64) {
	if c.rx.wasFullBefore(&c.in, old) {
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
		ringBell(c.ownBell)
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
