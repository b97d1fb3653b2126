package colo

// This side's waits (spec/WIRE.md section 6, the sleeper's steps): spin, announce, re-check,
// sleep. The goroutines of one side (a reader, a writer, Loan, Recv) take turns: one, the poller,
// sleeps on the doorbell in the netpoller (bellwait.go); the others wait for it to wake and then
// re-check. kick makes the poller wake when this side itself changed what its waiters wait for.

import (
	"sync/atomic"
	"time"
)

// kick wakes the operation sleeping in the netpoller (if any) so that every blocked operation
// re-checks its state. It expires the control socket file's own read deadline, which the runtime handles
// without a system call; the poller clears it before each sleep, after which its re-check sees
// whatever state change the kick announces.
//
// Only a goroutine counted in nwait can sleep: one that spins re-checks its condition anyway.
// The caller changed the state before calling kick, and a waiter counts itself under waitMu
// before the re-check that precedes its sleep, so a waiter we do not see here sees the change.
// So a kick with nobody waiting costs one uncontended lock, and no system call.
func (c *Conn) kick() {
	c.waitMu.Lock()
	n := c.nwait
	c.waitMu.Unlock()
	if n == 0 {
		return
	}
	c.ctl.SetReadDeadline(aLongTimeAgo)
	c.kicked.Store(true) // after the deadline; SYNC POINT with the Swap in pollOnce
}

// aLongTimeAgo is the deadline kick sets: one that has passed.
var aLongTimeAgo = time.Unix(1, 0)

// await blocks until ready() holds. ready must include every reason to wake: data, space,
// flags, control-socket hang-up, close, deadline. Spec section 6: spin; exchange waiting to 1;
// re-check; sleep on the doorbell. The flag is cleared (by exchange) only when no other
// goroutine of this side still waits on it.
func (c *Conn) await(ready func() bool, dl *deadline) {
	if c.spin.try(ready, func() bool { return c.closed.Load() || dl.expired() }) {
		return
	}
	c.waitMu.Lock()
	c.nwait++
	c.waitMu.Unlock()
	for !c.block(ready) && !ready() { // woken: re-check before polling again
	}
	c.waitMu.Lock()
	c.nwait--
	if c.nwait == 0 {
		// Read-modify-write, as every write of a waiting word (spec section 6). SYNC POINT
		// with the peer's exchange in its notify: a peer that exchanges after this finds no
		// bit and rings nobody.
		atomic.AndUint32(c.myWaiting, ^uint32(waitDoorbell))
	}
	c.waitMu.Unlock()
}

// block exchanges waiting to 1, re-checks ready() and, if it does not hold, sleeps once. It reports
// whether ready() was seen to hold. Only one waiter (the poller) sleeps in the netpoller; the
// others wait for it to wake up and then re-check. A sleeping poller wakes on any event, so that
// the others get to re-check their own conditions.
//
// A waiter that announced (set its bit) may lose its wake-up before the poller sleeps: the
// peer's exchange takes the bit and rings the doorbell before the runtime resets the doorbell's
// readiness for the poller's wait, which then never sees that ring. So an announcement that
// finds the word without a sleep bit (a wake-up took them) ends the round, whatever the
// announcer's own re-check finds: the poller's own ends its poll when followers wait, a
// follower's bumps lostWakes, which the poller checks in its re-check, and kicks a poller
// already asleep. So a writer waiting for space next to a reader waiting for data (an upload
// and its response) never both sleep through the one wake-up meant for one of them.
func (c *Conn) block(ready func() bool) bool {
	c.waitMu.Lock()
	if c.polling {
		ch := c.wakeCh
		c.wakeChUsed.Store(true) // SYNC POINT with the Load in pollCallback (and under waitMu, block's)
		c.waitMu.Unlock()
		// Read-modify-write of our waiting word (spec section 6); SYNC POINT with the peer's
		// exchange in its notify: our re-check below sees its progress, or it rings.
		old := atomic.OrUint32(c.myWaiting, waitDoorbell)
		c.releaseSpaceWaiter()
		if old&(waitDoorbell|waitFutex) == 0 {
			// Whatever our re-check finds: another follower may have lost its wake-up.
			c.lostWakes.Add(1) // before the kick; SYNC POINT with the Load in pollCallback
			c.kick()
		}
		if ready() {
			return true
		}
		<-ch
		return false
	}
	c.polling = true
	c.pollLostWakes = c.lostWakes.Load() // under waitMu: before any follower of this round
	c.waitMu.Unlock()
	if hook := testHookBeforePoll.Load(); hook != nil {
		(*hook)()
	}
	ok := c.pollOnce(ready)
	c.waitMu.Lock()
	c.polling = false
	if c.wakeChUsed.Load() { // else nobody waited on it: it stays good for the next poll
		close(c.wakeCh)
		c.wakeCh = make(chan struct{})
		c.wakeChUsed.Store(false)
	}
	c.waitMu.Unlock()
	return ok
}

// testHookBeforePoll, when set by a test, runs between a poller's taking its turn and its poll:
// it widens the window in which a follower's wake-up can be lost (see block).
var testHookBeforePoll atomic.Pointer[func()]
