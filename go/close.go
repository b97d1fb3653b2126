package colo

// Closing a colo connection (spec/WIRE.md section 8) and releasing or parking its segment
// (section 3, "Recycling").

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Close closes the connection: FIN and NOT_READING on our direction, READ_CLOSED on the peer's, a
// ring of the peer (if it sleeps), then the control socket and the mapping are released (a
// DIRECT connection that closes cleanly keeps its segment for a while, for the next connection
// between the same two processes: spec section 3, "Recycling"). Blocked operations return.
// Message views obtained from Recv and buffers from Loan must not be used after Close.
func (c *Conn) Close() error {
	if c.tcp != nil {
		return c.tcp.Close()
	}
	// SYNC POINT with the Load of closed in enter and in every ready condition: set before the
	// kick, so a woken operation sees it and leaves.
	if !c.closed.CompareAndSwap(false, true) {
		return c.opErr("close", net.ErrClosed)
	}
	c.kick() // wake blocked operations; they see closed and leave
	c.life.Lock()
	defer c.life.Unlock()
	if c.shortAP.IsValid() {
		// The bytes this side ever wrote and read, and whether it ever loaned or received a
		// message (the pool's bookkeeping is made then): no operation runs (life is held).
		now := time.Now()
		messages := c.pool.loaned != nil || c.pool.held != nil
		shortEnded(c.shortAP, now, wasShort(now.Sub(c.born), c.setupTook, c.tx.head+c.rx.tail, messages))
	}
	c.rdl.stop()
	c.wdl.stop()
	// SYNC POINT with the peer's loads of these words (its readSome, writeCheck and
	// cleanClose): every byte we published before FIN is visible to a peer that sees FIN.
	atomic.OrUint32(c.in.rflags, flagReadClosed)
	atomic.OrUint32(c.out.flags, flagFIN|flagNotReading)
	c.alertPeer()
	c.drainCtl()            // a hang-up, a protocol error or a late answer not seen yet
	clean := c.cleanClose() // our last use of the segment
	// Bytes a peer of another user (we read through the memfd) has yet to read, more than one
	// free part of our ring: kept for a bounded time (orphan.go), with the control socket
	// shut down for writing (the peer sees our hang-up) to watch for the peer's own, where it
	// refuses descriptors (else it is shut down both ways to be emptied, below).
	// Whether the peer holds messages is read once (its free_head may change between two
	// reads): the pool is kept exactly when the segment may be kept for it.
	gone := c.ctlGone.Load()
	ring := c.outgoingFree(gone)
	held := !gone && c.messagesHeld()
	orphan := c.in.file >= 0 && (len(ring) > 1 || held)
	free := append(append(ring, c.poolFree(c.seg, held)...), c.incomingPages())
	if !c.rightsOff {
		// A descriptor queued on it would be released by its close, in this thread.
		emptyCtlBeforeClose(c.ctlFd)
	}
	keepCtl := orphan && c.rightsOff
	if keepCtl {
		unix.Shutdown(c.ctlFd, unix.SHUT_WR)
	} else {
		c.ctl.Close()
	}
	// A segment read through its memfd is not parked: a recycled one comes without it
	// (readThrough).
	park := clean && c.carrier == nil && c.in.file < 0
	c.closeMemfd()
	if park {
		switch {
		case c.parkName != "":
			parkClient(c.parkName, c.peerPid, parkOf(c))
			c.seg = nil
			return nil
		case c.parkTable != nil && c.peerPid > 0:
			c.parkTable.park(int32(c.peerPid), parkOf(c))
			c.seg = nil
			return nil
		}
	}
	if c.carrier != nil {
		if debug {
			if rc, err := c.carrier.(*net.TCPConn).SyscallConn(); err == nil {
				rc.Control(func(fd uintptr) {
					n, _ := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
					if n > 0 { // a CARRIER peer must never send payload on the TCP connection
						logf("close: %d bytes were sent on the carrier TCP connection", n)
					}
				})
			}
		}
		if !c.isServer {
			// A client resets its carrier (spec section 3, step 4): a FIN close, the client
			// closing first as a connection per request does, would leave its bound odd port
			// in TIME_WAIT for a minute, where no carrier can bind it. The carrier carries no
			// byte and its server answers from the colo connection, not from the TCP socket
			// (the Go and Rust servers never read it; the shim answers getpeername and
			// SO_ERROR from the rings).
			c.carrier.(*net.TCPConn).SetLinger(0)
		}
		c.carrier.Close()
	}
	if orphan {
		c.keepOrphan(free, keepCtl)
	} else {
		unmapAfter(c.seg, free...)
	}
	c.seg = nil
	return nil
}

// outgoingFree is the parts of the ring we wrote that hold no byte the peer has yet to read:
// outside ring_tail..ring_head at ring_size, as the peer finds them; all of it once the peer is
// gone (nobody reads it), or where those words break the ring's rules (a scribble). The pages we
// first touched there are charged to our memory cgroup for as long as the peer keeps its memfd,
// after the connection is gone; given back, only the bytes still in flight stay, as a closed TCP
// socket holds only its unsent bytes.
func (c *Conn) outgoingFree(gone bool) [][]byte {
	// Our writes went below the larger of ring_size and the size our producer knew (a shrink
	// gave back the pages above it): a ring that never grew past its first page has nothing to
	// give back (no system call). data runs on to the pool (whose slots may hold messages in
	// flight), which starts on a page of its own: the padding after a whole ring goes with it.
	capa := uint64(c.lay.RingCapacity)
	// SYNC POINT with the peer's atomic store of ring_tail after its copies out: the bytes below
	// it are read. Head and size are our own, last stored before Close.
	tail := atomic.LoadUint64(c.out.tail)
	head := atomic.LoadUint64(c.out.head)
	size := uint64(atomic.LoadUint32(c.out.size))
	unread := head - tail
	valid := size != 0 && size&(size-1) == 0 && size <= capa && unread <= size
	end := c.tx.size
	if valid {
		end = max(end, size)
	}
	top := c.out.data[:min(end, capa)]
	if end >= capa {
		top = c.out.data
	}
	if gone || unread == 0 || !valid {
		return [][]byte{top}
	}
	a, b := tail%size, head%size
	if a < b {
		return [][]byte{top[:a], top[min(b, uint64(len(top))):]}
	}
	// Wrapped (or full): the bytes run from a to the ring's end and from its start to b.
	return [][]byte{top[b:a], top[min(size, uint64(len(top))):]}
}

// messagesHeld reports whether the peer may still read a message of the pool we send from: more
// sent (our msg_head) than it released (its free_head), by at most the slot count (more, or more
// released than sent, is a peer's scribble: the slots hold nothing it may read, as a reset would).
func (c *Conn) messagesHeld() bool {
	// SYNC POINT with the peer's store of free_head after its last read of the slots it
	// released. msg_head is our own, last stored before Close.
	out := atomic.LoadUint64(c.out.msgHead) - atomic.LoadUint64(c.out.freeHead)
	return len(c.out.pool) > 0 && out != 0 && out <= uint64(c.lay.SlotCount)
}

// poolFree is the pool we send messages from, to give back, unless held (the peer holds some of
// its messages: messagesHeld, read once by the caller for the decision this is part of; its slots
// are the peer's to read until it releases them, and Close keeps the segment for a peer of
// another user, orphan.go). From the pool's start to the end of our block, page-rounded inward
// by releasePages: the padding after the last slot goes with it, and never a page of the next
// block's words. seg: the segment's mapping (Close's, or the orphan's once Close let go of it).
func (c *Conn) poolFree(seg []byte, held bool) [][]byte {
	if held || len(c.out.pool) == 0 {
		return nil
	}
	return [][]byte{seg[c.out.base+c.lay.poolOff : c.out.base+c.lay.blockSize]}
}

// incomingPages is the part of the segment given back when it is unmapped for good: the
// direction we read, from its ring data on. Reading a page the peer never wrote (a hole: bytes
// it claimed and never wrote) made the kernel allocate it, charged to us, for as long as the
// peer keeps the memfd (a server its client's; a client its own, which the server holds). The
// direction's words, in the block's first page, stay.
func (c *Conn) incomingPages() []byte {
	in := uint64(headerSize)
	if !c.isServer {
		in += c.lay.blockSize
	}
	return c.seg[in+c.lay.dataOff : in+c.lay.blockSize]
}

// cleanClose reports whether this side may park the segment on Close (spec section 3,
// "Recycling"): no reset sent or seen, no corruption, no refused HELLO, and a peer that did not
// die (a hang-up without FIN).
func (c *Conn) cleanClose() bool {
	if c.fatal.Load() != nil {
		return false
	}
	// The hang-up first: a peer's FIN precedes its hang-up. SYNC POINT with the Store in
	// drainCtl, made after the control socket reported the hang-up.
	gone := c.ctlGone.Load()
	// SYNC POINT with the peer's ORs of its flags (FIN, RESET, READ_CLOSED: its Close,
	// CloseWrite, CloseRead, fail) and with ours (fail's RESET, made by any of our goroutines).
	in, out := atomic.LoadUint32(c.in.flags), atomic.LoadUint32(c.out.flags)
	rin, rout := atomic.LoadUint32(c.in.rflags), atomic.LoadUint32(c.out.rflags)
	closing := uint32(flagFIN | flagNotReading)
	return in&^closing == 0 && out&^closing == 0 && rin&^flagReadClosed == 0 &&
		rout&^flagReadClosed == 0 && (!gone || in&flagFIN != 0)
}

// unmapLater hands a segment mapping to a background goroutine. munmap of a shared mapping in a
// multi-threaded process costs TLB shoot-downs on every CPU the process ran on; doing it off the
// caller's path keeps Close (and so short-lived connections) cheap. Nothing touches the mapping
// after Close: every operation has left (Close holds the life lock exclusively).
func unmapLater(seg []byte) {
	unmapAfter(seg)
}

// unmapAfter is unmapLater that first gives back the pages of giveBack, parts of seg. Always in the one background goroutine: when it is behind, the caller waits for room
// in its queue (parked, holding no thread) rather than doing the work itself, since the Go
// runtime starts another thread for every goroutine blocked in a system call, each with a
// stack's address space: a flood of closes must not cost one each.
func unmapAfter(seg []byte, giveBack ...[]byte) {
	unmapOnce.Do(func() {
		unmapQueue = make(chan unmapJob, 1024)
		go func() {
			for j := range unmapQueue {
				j.run()
			}
		}()
	})
	unmapQueue <- unmapJob{seg, giveBack}
}

type unmapJob struct {
	seg      []byte
	giveBack [][]byte
}

func (j unmapJob) run() {
	// Where MADV_REMOVE fails the pages stay, which is only memory.
	for _, b := range j.giveBack {
		releasePages(b)
	}
	munmapSegment(j.seg)
}

var (
	unmapOnce  sync.Once
	unmapQueue chan unmapJob
)

// discard releases a server-side connection that was refused after its segment was mapped:
// unlike Close it leaves the segment untouched (no FIN), so that the client sees the REJECT.
func (c *Conn) discard() {
	c.closed.Store(true) // nobody else holds the connection yet: orders nothing
	c.ctl.Close()
	c.closeMemfd()
	unmapLater(c.seg)
	c.seg = nil
}
