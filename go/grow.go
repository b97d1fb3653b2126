package colo

// Growing and shrinking a connection's outgoing ring (spec/WIRE.md section 5, "Growing and
// shrinking"), the connection's part: how far a write may grow it, and the shrinker that takes a
// quiet ring back to 2 KiB and gives its pages back. The ring halves' part is in ring.go.

import (
	"math/bits"
	"net"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// serverRingBound is how far a server's outgoing ring grows by default: what its own TCP socket
// would buffer (defaultRingCapacity), whatever RingCapacity the client chose (up to 64 MiB a
// direction), so that a client that never reads holds no more of the server's memory than over
// TCP (the pages a ring grows into are the server's, which writes them first).
var serverRingBound = uint64(defaultRingCapacity())

// ringBound is the most bytes the outgoing ring ever holds unread (a power of two): the
// segment's RingCapacity, within serverRingBound on a server. A ring found larger (the client
// wrote its size word) is filled only that far and shrinks once empty (producer.fit).
func (c *Conn) ringBound() uint64 {
	capacity := uint64(c.lay.RingCapacity)
	if c.isServer {
		capacity = min(capacity, serverRingBound)
	}
	return capacity
}

// writeLimit is the largest size a write may grow the outgoing ring to (a power of two).
func (c *Conn) writeLimit() uint64 {
	capacity := c.ringBound()
	if l := c.sndLimit.Load(); l != 0 {
		return min(l, capacity)
	}
	return capacity
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

// shrinkTick is how often the shrinker looks: a ring found empty and unwritten at two looks in a
// row (so quiet for at most two ticks) shrinks.
const shrinkTick = 500 * time.Millisecond

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
	c.quietLooks = 0
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
		for i, c := range conns {
			c.shrinkIfQuiet()
			conns[i] = nil
		}
	}
}

// shrinkIfQuiet shrinks c's outgoing ring if this look and the one before found it empty and
// unwritten, and gives the pages beyond minRingSize back to the system. A connection whose writer
// is busy is skipped (its ring is not quiet).
func (c *Conn) shrinkIfQuiet() {
	if !c.wmu.TryLock() {
		return // a writer is busy: its write will move ring_head, which ends the quiet
	}
	defer c.wmu.Unlock()
	if !c.enter() {
		c.unwatchForShrink()
		return
	}
	defer c.exit()
	free, bad := c.tx.refresh(&c.out)
	if bad != "" {
		c.corrupt(bad)
		c.unwatchForShrink()
		return
	}
	empty := free == c.tx.size
	if !empty || c.tx.head != c.quietHead {
		c.quietLooks, c.quietHead = 0, c.tx.head
	}
	if !empty {
		return
	}
	if c.quietLooks++; c.quietLooks < 2 {
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
		// The page holding the old size's last bytes goes too: it holds nothing else in use.
		releasePages(c.out.spare[from:min(roundUpPage(c.out.spare, to), uint64(len(c.out.spare)))])
	}
	if c.tx.size <= minRingSize {
		c.unwatchForShrink()
	}
}

// releasePages gives the whole pages of b back to the system (MADV_REMOVE frees the memfd's pages
// for every process that maps them; they read as zeros after). Partial pages at either end stay:
// madvise takes page-aligned ranges only.
func releasePages(b []byte) {
	if len(b) == 0 {
		return
	}
	start := uintptr(unsafe.Pointer(&b[0]))
	first := (start + pageSize - 1) &^ (pageSize - 1)
	end := (start + uintptr(len(b))) &^ (pageSize - 1)
	if first >= end { // within one page: no whole page to give back
		return
	}
	from, to := first-start, end-start
	// Where MADV_REMOVE fails the pages stay, which is only memory.
	unix.Madvise(b[from:to], unix.MADV_REMOVE)
}

// roundUpPage is off rounded up to where the page holding byte off-1 of b ends.
func roundUpPage(b []byte, off uint64) uint64 {
	if len(b) == 0 {
		return off
	}
	start := uintptr(unsafe.Pointer(&b[0]))
	return uint64((start+uintptr(off)+pageSize-1)&^(pageSize-1) - start)
}

const pageSize = 4096
