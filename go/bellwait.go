package colo

// The poller's sleep on the doorbell, the control socket (spec section 6), and what it does with
// the doorbell before it sleeps: see Conn.block for how the waiters of one side take turns.

import (
	"sync/atomic"
	"time"
)

// pollOnce is the poller's sleep on the doorbell. The re-check after exchanging waiting to 1 runs
// inside the RawConn.Read callback, after the runtime has reset the descriptor's readiness, so a
// ring (or the hang-up) that comes after the store always wakes the netpoller wait that follows.
// The netpoller is edge-triggered and every datagram that arrives is an edge, so the doorbell
// need not be empty for the next ring to wake us; but its queue must not fill (a ring into a
// full queue is no edge: the peer's wake-up would be lost), and what came while nobody polled
// (a ring, the hang-up, a pending client's answer) left an edge the runtime has forgotten. So
// every poll drains the doorbell before it announces (drainCtl: one receive when it is empty):
// off the wake-up's path, and before the queue holds more than a few rings (an honest peer
// rings at most once per announcement). Drains swallow nothing another waiter needs: only the
// poller sleeps in the netpoller, and every waiter re-checks after any of its wake-ups (spec
// section 6).
func (c *Conn) pollOnce(ready func() bool) bool {
	// Clear the deadline a kick set (only then: a system-call-free but locked runtime call).
	// kick sets the deadline before it sets kicked, so either we see kicked and clear the
	// deadline after the kick's state change (the re-check below sees that change), or we do
	// not and the wait below returns at once (the next poll clears it).
	if c.kicked.Swap(false) { // SYNC POINT with the Store in kick
		c.ctl.SetReadDeadline(time.Time{})
	}
	c.pollCheck, c.pollFirst, c.pollOK = ready, true, false
	c.ctlRaw.Read(c.pollFn) // an error is a kick's: our caller re-checks
	c.pollCheck = nil
	return c.pollOK
}

// pollCallback is pollOnce's RawConn.Read callback (c.pollFn).
func (c *Conn) pollCallback(uintptr) bool {
	if !c.pollFirst {
		return true // woken: our caller re-checks
	}
	c.pollFirst = false
	if c.drainCtl() {
		// More is queued than one drain takes (a peer that floods us): no edge may come for
		// it, so no sleep; the next poll drains on.
		c.pollOK = c.pollCheck()
		return true
	}
	// Read-modify-write of our waiting word (spec section 6); SYNC POINT with the peer's
	// exchange in its notify: our re-check below sees its progress, or it rings.
	old := atomic.OrUint32(c.myWaiting, waitDoorbell)
	c.releaseSpaceWaiter()
	c.pollOK = c.pollCheck()
	// A follower's wake-up may have been lost (see block): end this poll so it re-checks.
	// SYNC POINT with the Store of wakeChUsed and the Add to lostWakes in block.
	lost := old&(waitDoorbell|waitFutex) == 0 && c.wakeChUsed.Load() || c.lostWakes.Load() != c.pollLostWakes
	return c.pollOK || lost
}
