package colo

// The poller's sleep on the doorbell (spec section 6), and what it does with the doorbell when it
// wakes: see Conn.block for how the waiters of one side take turns.

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// pollOnce is the poller's sleep on the doorbell. The re-check after exchanging waiting to 1 runs
// inside the RawConn.Read callback, after the runtime has reset the descriptor's readiness, so a
// doorbell rung after the store always wakes the netpoller wait that follows. The netpoller is
// edge-triggered and every byte sent to a Unix stream socket is an edge, so the doorbell need not
// be empty for the next ring to wake us; but its buffer must not fill (a ring into a full buffer
// is no edge: the peer's wake-up would be lost). So whenever a ring may have landed (the
// netpoller woke us, a poll ended at its first look or by a kick, a follower announced), the
// runtime having forgotten that edge by the next poll, bellDirty says so, and the next poll
// empties the doorbell before it announces: off the wake-up's path, and before the buffer holds
// more than a few bytes (an honest peer rings at most once per announcement). Drains swallow
// nothing another waiter needs: only the poller sleeps in the netpoller, and every waiter
// re-checks after any of its wake-ups (spec section 6).
func (c *Conn) pollOnce(ready func() bool) bool {
	// Clear the deadline a kick set (only then: a system-call-free but locked runtime call).
	// kick sets the deadline before it sets kicked, so either we see kicked and clear the
	// deadline after the kick's state change (the re-check below sees that change), or we do
	// not and the wait below returns at once (the next poll clears it).
	if c.kicked.Swap(false) { // SYNC POINT with the Store in kick
		c.bell.SetReadDeadline(time.Time{})
	}
	c.pollCheck, c.pollFirst, c.pollOK = ready, true, false
	if c.bellRaw.Read(c.pollFn) != nil {
		// A kick ended the wait: our announcement may still be answered. SYNC POINT with
		// the Swap in pollCallback (the next poll's).
		c.bellDirty.Store(true)
	}
	c.pollCheck = nil
	return c.pollOK
}

// pollCallback is pollOnce's RawConn.Read callback (c.pollFn).
func (c *Conn) pollCallback(uintptr) bool {
	if c.pollFirst {
		c.pollFirst = false
		// SYNC POINT with the Stores of bellDirty (block, pollOnce, here): a ring that may have
		// landed since the last drain is drained before we announce.
		if c.bellDirty.Swap(false) {
			c.drainBell()
		}
		// Read-modify-write of our waiting word (spec section 6); SYNC POINT with the peer's
		// exchange in its notify: our re-check below sees its progress, or it rings.
		old := atomic.OrUint32(c.myWaiting, waitDoorbell)
		c.releaseSpaceWaiter()
		c.pollOK = c.pollCheck()
		// A follower's wake-up may have been lost (see block): end this poll so it re-checks.
		// SYNC POINT with the Store of wakeChUsed and the Add to lostWakes in block.
		lost := old&(waitDoorbell|waitFutex) == 0 && c.wakeChUsed.Load() || c.lostWakes.Load() != c.pollLostWakes
		if c.pollOK || lost {
			c.bellDirty.Store(true) // the peer may answer our announcement after the poll
			return true
		}
		return false
	}
	// Woken: the doorbell is emptied before the next sleep, not now (the re-check comes first).
	c.bellDirty.Store(true)
	return true
}

// drainBell empties our doorbell; one at end of stream is the peer's hang-up.
func (c *Conn) drainBell() {
	if _, hungUp := drainBell(c.ownBell); hungUp {
		c.bellHungUp()
	}
}

// bellHungUp handles a doorbell whose other end was shut down or closed: no ring can come any
// more. It is the peer's hang-up (spec section 8): our control socket is shut down, so that the
// control-socket watcher sees the hang-up and wakes every waiter. Called by an operation (the
// life lock is held: Close has not closed the control socket).
func (c *Conn) bellHungUp() {
	unix.Shutdown(c.ctlFd, unix.SHUT_RDWR)
}
