package colo

// The stream half of a colo connection: Read and Write over the two byte rings (spec/WIRE.md
// section 5), the flags that end them (section 8), and the conditions a blocked Read or Write
// waits for (section 6).

import (
	"io"
	"net"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Read reads up to len(p) bytes. It implements net.Conn.
func (c *Conn) Read(p []byte) (int, error) {
	if c.tcp != nil {
		if c.owed.Load() && len(p) > 0 {
			if err := c.takeOwed(); err != nil {
				return 0, err
			}
		}
		return c.tcp.Read(p)
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if !c.enter() {
		return 0, c.opErr("read", net.ErrClosed)
	}
	defer c.exit()
	for {
		if c.rdl.expired() {
			// One error value per connection, made once: a read that ends on its deadline
			// allocates nothing (net/http's server ends a background read so per request).
			if c.rdlErr == nil {
				c.rdlErr = c.opErr("read", os.ErrDeadlineExceeded)
			}
			return 0, c.rdlErr
		}
		n, err, done := c.readSome(p)
		if done {
			return n, c.opErr("read", err)
		}
		c.await(c.readReadyFn, &c.rdl)
		if c.closed.Load() {
			return 0, c.opErr("read", net.ErrClosed)
		}
	}
}

// readReady is the condition a blocked Read waits for: any of them makes readSome finish.
func (c *Conn) readReady() bool {
	// SYNC POINT with the store of ring_head in the peer's producer.write (a published byte
	// ends the wait); the flags load with the peer's ORs of ring_flags (FIN, RESET).
	return c.closed.Load() || c.rdl.expired() || c.ctlGone.Load() || c.rdClosed.Load() ||
		c.fatal.Load() != nil || atomic.LoadUint64(c.in.head) != c.rx.tail || readFlagsSet(c.in.flags)
}

// readFlagsSet reports whether the incoming ring's flags end or break a read: every bit but
// NOT_READING (which concerns our writes; a reader woken by it would spin, as it stays set).
func readFlagsSet(flags *uint32) bool {
	// SYNC POINT with the peer's OR of ring_flags (CloseWrite, Close, fail).
	return atomic.LoadUint32(flags)&^flagNotReading != 0
}

// readSome copies available bytes; done is false when the caller must wait.
func (c *Conn) readSome(p []byte) (n int, err error, done bool) {
	if err := c.fatalErr(); err != nil {
		return 0, err, true
	}
	if c.rdClosed.Load() {
		return 0, io.EOF, true
	}
	capy := uint64(c.lay.RingCapacity)
	if c.rx.cached() == 0 {
		// The flags before ring_head: every byte published before FIN is then seen with it.
		// SYNC POINT with the peer's OR of ring_flags (FIN after its last ring_head store).
		fl := atomic.LoadUint32(c.in.flags)
		if badRingFlags(fl) {
			return 0, c.corrupt("unknown ring flags"), true
		}
		if fl&flagRESET != 0 {
			return 0, c.fail(errnoErr("read", unix.ECONNRESET), false), true
		}
		avail, bad := c.rx.refresh(&c.in, capy)
		if bad != "" {
			return 0, c.corrupt(bad), true
		}
		if avail == 0 {
			if fl&flagFIN != 0 {
				return 0, io.EOF, true
			}
			if c.ctlGone.Load() {
				// Re-read after seeing the hang-up: FIN and data precede it.
				// SYNC POINT with the peer's OR of ring_flags and store of ring_head, both
				// before its control socket hung up (ctlGone, set by drainCtl after that).
				fl = atomic.LoadUint32(c.in.flags)
				if atomic.LoadUint64(c.in.head) != c.rx.tail {
					return 0, nil, false
				}
				if fl&flagFIN != 0 {
					return 0, io.EOF, true
				}
				return 0, c.fail(errnoErr("read", unix.ECONNRESET), false), true
			}
			if len(p) == 0 {
				return 0, nil, true
			}
			return 0, nil, false
		}
	}
	if len(p) == 0 {
		return 0, nil, true
	}
	got, before, bad := c.rx.read(&c.in, capy, p)
	if bad != "" {
		return 0, c.corrupt(bad), true
	}
	if got == 0 {
		// Bytes were readable (avail above): only the peer's DROPPED makes a read take none.
		return 0, c.fail(errnoErr("read", unix.ECONNRESET), false), true
	}
	c.notifySpace(before)
	return int(got), nil, true
}

// Write writes all of p unless an error occurs. It implements net.Conn.
func (c *Conn) Write(p []byte) (int, error) {
	if c.tcp != nil {
		return c.tcp.Write(p)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.enter() {
		return 0, c.opErr("write", net.ErrClosed)
	}
	defer c.exit()
	written := 0
	for {
		if written == len(p) && written > 0 {
			return written, nil // done: a peer that closed after reading it all is no error
		}
		if err := c.writeCheck(); err != nil {
			return written, c.opErr("write", err)
		}
		if len(p) == 0 {
			return 0, nil
		}
		limit := c.writeLimit()
		free, bad := c.tx.space(&c.out, limit, c.ringBound())
		if bad != "" {
			return written, c.opErr("write", c.corrupt(bad))
		}
		if free == 0 { // full at the limit
			c.await(c.writeReadyFn, &c.wdl)
			continue
		}
		// Published in pieces (spec section 5), so that the consumer copies out while we
		// copy in.
		n := min(free, uint64(len(p)-written), maxPublishChunk)
		if bad := c.tx.write(&c.out, p[written:written+int(n)], limit); bad != "" {
			return written, c.opErr("write", c.corrupt(bad))
		}
		if c.tx.size > minRingSize && !c.shrinkable {
			c.watchForShrink()
		}
		c.notifyPeer()
		written += int(n)
	}
}

// writeCheck returns the error that ends a Write now, if any.
func (c *Conn) writeCheck() error {
	if c.closed.Load() {
		return net.ErrClosed
	}
	if err := c.fatalErr(); err != nil {
		return err
	}
	if c.wdl.expired() {
		return os.ErrDeadlineExceeded
	}
	if c.wrClosed.Load() {
		return errnoErr("write", unix.EPIPE)
	}
	// SYNC POINT with the peer's OR of its ring_flags (RESET, NOT_READING).
	fl := atomic.LoadUint32(c.in.flags)
	if badRingFlags(fl) {
		return c.corrupt("unknown ring flags")
	}
	if fl&flagRESET != 0 {
		return c.fail(errnoErr("write", unix.ECONNRESET), false)
	}
	// The peer stopped reading: seen in its own ring's flags, not in our ring's read_flags.
	if fl&flagNotReading != 0 || c.ctlGone.Load() {
		return errnoErr("write", unix.EPIPE)
	}
	return nil
}

// writeReady is the condition a blocked Write waits for: space, or anything that ends the Write.
func (c *Conn) writeReady() bool {
	// SYNC POINT with the store of ring_tail in the peer's consumer.read (space), and with the
	// peer's OR of its ring_flags (RESET, NOT_READING).
	return c.closed.Load() || c.wdl.expired() || c.ctlGone.Load() || c.fatal.Load() != nil ||
		atomic.LoadUint64(c.out.tail) != c.tx.cachedTail || atomic.LoadUint32(c.in.flags)&(flagRESET|flagNotReading) != 0
}

// CloseWrite shuts down the writing side (FIN): the peer reads the remaining bytes, then EOF.
func (c *Conn) CloseWrite() error {
	if c.tcp != nil {
		return c.tcp.CloseWrite()
	}
	if !c.enter() {
		return c.opErr("close", net.ErrClosed)
	}
	defer c.exit()
	c.wrClosed.Store(true) // our own next Write fails (writeCheck); orders nothing else
	// SYNC POINT with the peer's load of ring_flags in its readSome: every byte we published
	// (ring_head) before FIN is visible to a reader that sees FIN.
	atomic.OrUint32(c.out.flags, flagFIN)
	c.alertPeer()
	return nil
}

// CloseRead shuts down the reading side: our reads return EOF and the peer's writes fail (EPIPE):
// READ_CLOSED in the peer's ring, NOT_READING in ours (spec section 8).
func (c *Conn) CloseRead() error {
	if c.tcp != nil {
		return c.tcp.CloseRead()
	}
	if !c.enter() {
		return c.opErr("close", net.ErrClosed)
	}
	defer c.exit()
	c.rdClosed.Store(true) // before the kick; SYNC POINT with the Load in readReady
	// SYNC POINT with the peer's loads of these words (its writeCheck reads NOT_READING; its
	// cleanClose reads READ_CLOSED).
	atomic.OrUint32(c.in.rflags, flagReadClosed)
	atomic.OrUint32(c.out.flags, flagNotReading)
	c.alertPeer()
	c.kick()
	return nil
}
