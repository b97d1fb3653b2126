package colo

// Growing and shrinking a connection's byte rings (spec/WIRE.md section 5, "Growing and
// shrinking"), the connection's part: when the consumer serves the peer's request, how far the
// producer may ask, and the shrinker that gives an idle ring's pages back. The ring halves'
// part is in ring.go.

import (
	"math/bits"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// serveGrowthIfAsked serves the peer's request to grow our incoming ring, if one stands, and wakes
// the peer when the ring grew. The caller holds rmu (the consumer's lock). The returned error is
// the connection's fatal error when the request was corrupt.
func (c *Conn) serveGrowthIfAsked() error {
	if !growthAsked(&c.in) {
		return nil
	}
	grew, bad := c.rx.serveGrowth(&c.in, uint64(c.lay.RingCapacity))
	if bad != "" {
		return c.corrupt(bad)
	}
	if grew {
		c.notifyPeer() // whatever the peer waits for: its request was answered
	}
	return nil
}

// tryServeGrowth is serveGrowthIfAsked for a goroutine that does not hold rmu: every wait of the
// connection serves the peer's request (a writer blocked on its own full ring included), unless
// a reader holds rmu, which serves it in its own read or wait.
func (c *Conn) tryServeGrowth() {
	if !growthAsked(&c.in) || !c.rmu.TryLock() {
		return
	}
	c.serveGrowthIfAsked()
	c.rmu.Unlock()
}

// writeLimit is the largest size the outgoing ring may be asked to grow to.
func (c *Conn) writeLimit() uint64 {
	if l := c.sndLimit.Load(); l != 0 {
		return l
	}
	return uint64(c.lay.RingCapacity)
}

// SetWriteBuffer bounds how far this connection's outgoing ring may grow: to the smallest power of
// two of at least bytes (and at least 4 KiB), never beyond the segment's RingCapacity. A ring
// already larger shrinks back once idle, and grows again only up to the new bound. On a TCP
// connection it sets SO_SNDBUF.
func (c *Conn) SetWriteBuffer(bytes int) error {
	if c.tcp != nil {
		return c.tcp.SetWriteBuffer(bytes)
	}
	if bytes < 0 {
		return c.opErr("set", unix.EINVAL)
	}
	if c.closed.Load() {
		return c.opErr("set", net.ErrClosed)
	}
	limit := uint64(minRingSize)
	if b := uint64(bytes); b > limit {
		limit = 1 << bits.Len64(b-1)
	}
	c.sndLimit.Store(limit)
	return nil
}

// shrinkIdle is how long an outgoing ring must have been empty and unwritten before the shrinker
// takes it back to minRingSize bytes; shrinkTick is how often the shrinker looks.
const (
	shrinkIdle = int64(time.Second)
	shrinkTick = 250 * time.Millisecond
)

// shrinker watches the connections whose outgoing ring has grown past minRingSize bytes. Its
// goroutine runs while it watches any.
var shrinker struct {
	sync.Mutex
	conns   map[*Conn]struct{}
	running bool
}

// watchForShrink has the shrinker watch c. The caller holds wmu.
func (c *Conn) watchForShrink() {
	c.shrinkable = true
	c.idleHead, c.idleSince = c.tx.head, nanotime()
	shrinker.Lock()
	if shrinker.conns == nil {
		shrinker.conns = map[*Conn]struct{}{}
	}
	shrinker.conns[c] = struct{}{}
	if !shrinker.running {
		shrinker.running = true
		go shrinkLoop()
	}
	shrinker.Unlock()
}

// unwatchForShrink ends the shrinker's watch of c. The caller holds wmu, so that a Write that
// grows the ring again watches it again.
func (c *Conn) unwatchForShrink() {
	c.shrinkable = false
	shrinker.Lock()
	delete(shrinker.conns, c)
	shrinker.Unlock()
}

func shrinkLoop() {
	t := time.NewTicker(shrinkTick)
	defer t.Stop()
	var conns []*Conn
	for range t.C {
		shrinker.Lock()
		if len(shrinker.conns) == 0 {
			shrinker.running = false
			shrinker.Unlock()
			return
		}
		conns = conns[:0]
		for c := range shrinker.conns {
			conns = append(conns, c)
		}
		shrinker.Unlock()
		now := nanotime()
		for i, c := range conns {
			c.shrinkIfIdle(now)
			conns[i] = nil
		}
	}
}

// shrinkIfIdle shrinks c's outgoing ring if it has been empty and unwritten for shrinkIdle, and
// gives the pages beyond minRingSize back to the system. A connection whose writer is busy is
// skipped until the next look.
func (c *Conn) shrinkIfIdle(now int64) {
	if !c.wmu.TryLock() {
		return
	}
	defer c.wmu.Unlock()
	if !c.enter() {
		c.unwatchForShrink()
		return
	}
	defer c.exit()
	if c.tx.head != c.idleHead {
		c.idleHead, c.idleSince = c.tx.head, now
		return
	}
	if now-c.idleSince < shrinkIdle {
		return
	}
	from, to, bad := c.tx.shrinkIfEmpty(&c.out)
	if bad != "" {
		c.corrupt(bad)
		c.unwatchForShrink()
		return
	}
	if to != 0 {
		// The pages of [from, to) hold no byte in flight, and neither side touches them before
		// the ring grows again. Where MADV_REMOVE fails they stay, which is only memory.
		unix.Madvise(c.out.data[from:to], unix.MADV_REMOVE)
	}
	if c.tx.size <= minRingSize {
		c.unwatchForShrink()
	}
}
