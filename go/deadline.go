package colo

// Deadlines (net.Conn's SetDeadline family). A deadline is a time that blocked operations compare
// with the clock in their ready condition; setting an earlier one kicks them (wait.go), and a
// timer kicks them when it passes.

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// deadline is one of a connection's two deadlines (read, write).
type deadline struct {
	mu    sync.Mutex
	t     atomic.Int64 // UnixNano; 0 means none
	timer *time.Timer
}

func (d *deadline) set(t time.Time, kick func()) {
	if t.IsZero() && d.t.Load() == 0 {
		// Nothing to remove, and nothing locked or allocated to find out: without a deadline
		// there is no timer either, as a timer is made only with a deadline and removed with
		// it. SYNC POINT with the Stores below, made under mu.
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	old := d.t.Load()
	if t.IsZero() {
		d.t.Store(0)
		return // a removed deadline needs no wake-up
	}
	nt := t.UnixNano()
	// SYNC POINT with the Load in expired: stored before the kick (and the timer's), so a
	// woken operation compares with the new deadline.
	d.t.Store(nt)
	if dur := time.Until(t); dur > 0 {
		d.timer = time.AfterFunc(dur, kick)
	}
	if old == 0 || nt < old {
		kick() // blocked operations re-evaluate their deadline
	}
}

// stop cancels the timer (Close).
func (d *deadline) stop() {
	d.mu.Lock()
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	d.mu.Unlock()
}

// expired reports whether the deadline has passed.
func (d *deadline) expired() bool {
	t := d.t.Load() // SYNC POINT with the Stores in set
	return t != 0 && time.Now().UnixNano() >= t
}

// SetDeadline sets the read and write deadlines. Blocked operations see the new deadline.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.tcp != nil {
		return c.tcp.SetDeadline(t)
	}
	if c.closed.Load() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdl.set(t, c.kickFn)
	c.wdl.set(t, c.kickFn)
	return nil
}

// SetReadDeadline sets the read deadline (reads and Recv).
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.tcp != nil {
		return c.tcp.SetReadDeadline(t)
	}
	if c.closed.Load() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdl.set(t, c.kickFn)
	return nil
}

// SetWriteDeadline sets the write deadline (writes and Loan).
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.tcp != nil {
		return c.tcp.SetWriteDeadline(t)
	}
	if c.closed.Load() {
		return c.opErr("set", net.ErrClosed)
	}
	c.wdl.set(t, c.kickFn)
	return nil
}
