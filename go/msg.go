package colo

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Zero-copy messages (spec/WIRE.md section 7). The producer loans a pool slot, fills it in place
// and sends it; the consumer receives a view of the slot, reads it in place and releases it.
// Messages and stream bytes are independent: there is no ordering between them.

// bitset is a bit a slot, in chunks of bitsetChunk slots, each made at the first slot of its
// range that is set: a pool the peer made large costs a pointer a chunk (16 for 65536 slots)
// until its slots are used, and 512 bytes a chunk in use.
type bitset [][]uint64

const bitsetChunk = 4096

func (b bitset) has(slot uint32) bool {
	c := b[slot/bitsetChunk]
	return c != nil && c[slot%bitsetChunk/64]&(1<<(slot%64)) != 0
}

func (b bitset) set(slot uint32) {
	c := b[slot/bitsetChunk]
	if c == nil {
		c = make([]uint64, bitsetChunk/64)
		b[slot/bitsetChunk] = c
	}
	c[slot%bitsetChunk/64] |= 1 << (slot % 64)
}

func (b bitset) clear(slot uint32) {
	if c := b[slot/bitsetChunk]; c != nil {
		c[slot%bitsetChunk/64] &^= 1 << (slot % 64)
	}
}

func newBitset(n uint64) bitset { return make(bitset, (n+bitsetChunk-1)/bitsetChunk) }

type poolState struct {
	pmu sync.Mutex // producer side: Loan, Send, Release of an unsent loan
	// Slots fresh.. were never loaned: free.
	fresh uint32
	// Slots taken back (released by the peer, or loaned and not sent), free to loan again: no
	// more than the slots loaned so far, so its size follows the pool's use, not its size.
	free      []uint32
	loaned    bitset // loaned, not sent
	inFlight  bitset // sent, not yet released by the peer
	msgHead   uint64
	freeTail  uint64
	cmu       sync.Mutex // consumer side: Recv, Release of a received message
	msgTail   uint64
	cMsgHead  uint64
	freeHead  uint64
	held      bitset // received, not yet released
	slotCount uint64
	// Copies of msgTail and freeTail for the conditions blocked Recv and Loan wait for, which
	// run without cmu and pmu. The shared msg_tail and free_tail words are ours to write but
	// the peer's to scribble: a wait on them as the peer left them would never sleep again.
	// They order nothing (atomic only for the unlocked loads): a stale copy costs one more
	// look, made under the lock, which reads the counter itself.
	msgTailSeen  atomic.Uint64
	freeTailSeen atomic.Uint64
}

// init records the pool's slot count. The per-slot bookkeeping, bitsets sized by the peer's
// choice of slot_count (up to 65536: 8 KiB each), is made by a side's first Loan (producer) or
// Recv (consumer), so that a connection whose program never uses messages costs none of it.
func (p *poolState) init(n uint32) {
	p.slotCount = uint64(n)
}

// producerSlots makes the producer's bookkeeping at the first Loan (pmu held).
func (p *poolState) producerSlots() {
	if p.loaned != nil {
		return
	}
	p.loaned, p.inFlight = newBitset(p.slotCount), newBitset(p.slotCount)
}

// takeFree takes a free slot, a taken-back one first, without looking at the free queue (pmu
// held).
func (p *poolState) takeFree() (uint32, bool) {
	if k := len(p.free); k > 0 {
		slot := p.free[k-1]
		p.free = p.free[:k-1]
		return slot, true
	}
	if uint64(p.fresh) < p.slotCount {
		p.fresh++
		return p.fresh - 1, true
	}
	return 0, false
}

// Message is a zero-copy message. For a loaned message, Data is the slot in shared memory that
// the caller fills; it may be shortened (m.Data = m.Data[:n]) before Send, which sends len(Data)
// bytes. For a received message, Data is a view of the sender's bytes, read in place; it is valid
// until Release.
type Message struct {
	Data     []byte
	c        *Conn
	slot     uint32
	received bool
	done     bool
}

var (
	// ErrMessageSize is returned by Loan for a size larger than the pool's slot size (EMSGSIZE).
	ErrMessageSize = unix.EMSGSIZE
	// ErrNoPool is returned by message operations on a connection without a pool (ENOBUFS),
	// including a connection that fell back to TCP.
	ErrNoPool        = unix.ENOBUFS
	errBadMessageUse = errors.New("colo: message not loaned from or received on this connection, or already used")
	errNoPool        = errors.New("colo: connection has no message pool")
)

// SlotSize returns the largest message this connection can loan (0: no pool).
func (c *Conn) SlotSize() int {
	if c.tcp != nil {
		return 0
	}
	return int(c.lay.SlotSize)
}

// Loan takes a free slot of the outgoing pool, waiting (until the write deadline) if every slot is
// in flight. The returned message's Data has length size.
func (c *Conn) Loan(size int) (*Message, error) {
	if c.tcp != nil || c.lay.SlotCount == 0 {
		return nil, c.opErr("loan", errnoErr("loan", ErrNoPool))
	}
	if size < 0 || size > int(c.lay.SlotSize) {
		return nil, c.opErr("loan", errnoErr("loan", ErrMessageSize))
	}
	p := &c.pool
	if !c.enter() {
		return nil, c.opErr("loan", net.ErrClosed)
	}
	defer c.exit()
	p.pmu.Lock()
	defer p.pmu.Unlock()
	p.producerSlots()
	for {
		if err := c.writeCheck(); err != nil {
			return nil, c.opErr("loan", err)
		}
		if slot, ok := p.takeFree(); ok {
			p.loaned.set(slot)
			off := uint64(slot) * uint64(c.lay.SlotSize)
			return &Message{Data: c.out.pool[off : off+uint64(size) : off+uint64(c.lay.SlotSize)], c: c, slot: slot}, nil
		}
		got, err := c.reclaim()
		if err != nil {
			return nil, c.opErr("loan", err)
		}
		if !got {
			// Wait without the lock: another goroutine may Send or Release meanwhile.
			p.pmu.Unlock()
			c.await(c.loanFn, &c.wdl)
			p.pmu.Lock()
		}
	}
}

// reclaim takes released slots back from the free queue (producer side, pmu held).
func (c *Conn) reclaim() (bool, error) {
	p := &c.pool
	n := p.slotCount
	// SYNC POINT with the peer's store of free_head in its Release: the free entries it wrote
	// before are visible to the loop below.
	fh := atomic.LoadUint64(c.out.freeHead)
	if fh-p.freeTail > n {
		return false, c.corrupt("free queue head out of range")
	}
	got := false
	for p.freeTail != fh {
		slot := getLE32(c.out.freeEnt, 4*(p.freeTail%n))
		if uint64(slot) >= n || !p.inFlight.has(slot) {
			return false, c.corrupt("released slot not in flight")
		}
		p.inFlight.clear(slot)
		p.free = append(p.free, slot)
		p.freeTail++
		got = true
	}
	if got {
		// Our own counter (the peer reads it only to validate); it publishes nothing.
		atomic.StoreUint64(c.out.freeTail, p.freeTail)
		p.freeTailSeen.Store(p.freeTail)
	}
	return got, nil
}

// loanReady is the condition a blocked Loan waits for: a released slot, or anything that ends
// the Loan.
func (c *Conn) loanReady() bool {
	// SYNC POINT with the peer's store of free_head in its Release.
	return c.writeReadyCommon() || atomic.LoadUint64(c.out.freeHead) != c.pool.freeTailSeen.Load()
}

// writeReadyCommon is what ends any wait of a producer: close, deadline, hang-up, a fatal error,
// the peer's RESET or NOT_READING.
func (c *Conn) writeReadyCommon() bool {
	// SYNC POINT with the peer's OR of its ring_flags (RESET, NOT_READING).
	return c.closed.Load() || c.wdl.expired() || c.ctlGone.Load() || c.fatal.Load() != nil ||
		atomic.LoadUint32(c.in.flags)&(flagRESET|flagNotReading) != 0
}

// Send sends a loaned message: the peer receives len(m.Data) bytes, in place.
func (c *Conn) Send(m *Message) error {
	if c.tcp != nil || c.lay.SlotCount == 0 {
		return c.opErr("send", errnoErr("send", ErrNoPool))
	}
	p := &c.pool
	if !c.enter() {
		return c.opErr("send", net.ErrClosed)
	}
	defer c.exit()
	p.pmu.Lock()
	defer p.pmu.Unlock()
	if m == nil || m.c != c || m.received || m.done || !p.loaned.has(m.slot) {
		return errBadMessageUse
	}
	if len(m.Data) > int(c.lay.SlotSize) {
		return c.opErr("send", errnoErr("send", ErrMessageSize))
	}
	if err := c.writeCheck(); err != nil {
		return c.opErr("send", err)
	}
	n := p.slotCount
	e := 8 * (p.msgHead % n)
	putLE32(c.out.msgEnt, e, m.slot)
	putLE32(c.out.msgEnt, e+4, uint32(len(m.Data)))
	p.loaned.clear(m.slot)
	p.inFlight.set(m.slot)
	m.done = true
	m.Data = nil
	p.msgHead++
	// SYNC POINT with the load of msg_head in the peer's Recv: the entry written above is
	// visible to a consumer that sees the new head.
	atomic.StoreUint64(c.out.msgHead, p.msgHead)
	c.notifyPeer()
	return nil
}

// Recv receives the next message, waiting until the read deadline. The message's Data is a view
// of shared memory; call Release when done with it. Recv returns io.EOF once the peer has closed
// its direction and every message was received.
func (c *Conn) Recv() (*Message, error) {
	if c.tcp != nil || c.lay.SlotCount == 0 {
		return nil, c.opErr("recv", errnoErr("recv", ErrNoPool))
	}
	p := &c.pool
	if !c.enter() {
		return nil, c.opErr("recv", net.ErrClosed)
	}
	defer c.exit()
	p.cmu.Lock()
	defer p.cmu.Unlock()
	if p.held == nil {
		p.held = newBitset(p.slotCount) // the consumer's bookkeeping, at the first Recv (see init)
	}
	n := p.slotCount
	for {
		if c.closed.Load() {
			return nil, c.opErr("recv", net.ErrClosed)
		}
		if c.rdl.expired() {
			return nil, c.opErr("recv", os.ErrDeadlineExceeded)
		}
		if err := c.fatalErr(); err != nil {
			return nil, c.opErr("recv", err)
		}
		if c.rdClosed.Load() {
			return nil, io.EOF
		}
		if p.cMsgHead == p.msgTail {
			// The flags before msg_head, as in readSome. SYNC POINT with the peer's OR of
			// ring_flags (FIN after its last msg_head store).
			fl := atomic.LoadUint32(c.in.flags)
			if badRingFlags(fl) {
				return nil, c.opErr("recv", c.corrupt("unknown ring flags"))
			}
			if fl&flagRESET != 0 {
				return nil, c.opErr("recv", c.fail(errnoErr("recv", unix.ECONNRESET), false))
			}
			// SYNC POINT with the store of msg_head in the peer's Send.
			h := atomic.LoadUint64(c.in.msgHead)
			if h-p.msgTail > n || h-p.cMsgHead > n {
				return nil, c.opErr("recv", c.corrupt("message head out of range"))
			}
			p.cMsgHead = h
			if h == p.msgTail {
				if fl&flagFIN != 0 {
					return nil, io.EOF
				}
				if c.ctlGone.Load() {
					// Re-read after seeing the hang-up: FIN and messages precede it (SYNC
					// POINT with the peer's stores, as in readSome).
					fl = atomic.LoadUint32(c.in.flags)
					if atomic.LoadUint64(c.in.msgHead) != p.msgTail {
						continue
					}
					if fl&flagFIN != 0 {
						return nil, io.EOF
					}
					return nil, c.opErr("recv", c.fail(errnoErr("recv", unix.ECONNRESET), false))
				}
				// Wait without the lock: another goroutine may Release meanwhile.
				p.cmu.Unlock()
				c.await(c.recvFn, &c.rdl)
				p.cmu.Lock()
				continue
			}
		}
		e := 8 * (p.msgTail % n)
		slot := getLE32(c.in.msgEnt, e)
		ln := getLE32(c.in.msgEnt, e+4)
		if uint64(slot) >= n || ln > c.lay.SlotSize || p.held.has(slot) {
			return nil, c.opErr("recv", c.corrupt("bad message entry"))
		}
		p.held.set(slot)
		p.msgTail++
		// Our own counter (the peer reads it only to validate); the slot is given back by
		// Release, not by this store.
		atomic.StoreUint64(c.in.msgTail, p.msgTail)
		p.msgTailSeen.Store(p.msgTail)
		off := uint64(slot) * uint64(c.lay.SlotSize)
		return &Message{Data: c.in.pool[off : off+uint64(ln) : off+uint64(ln)], c: c, slot: slot, received: true}, nil
	}
}

// recvReady is the condition a blocked Recv waits for: a message, or anything that ends the Recv.
func (c *Conn) recvReady() bool {
	// SYNC POINT with the store of msg_head in the peer's Send, and its ORs of ring_flags.
	return c.closed.Load() || c.rdl.expired() || c.ctlGone.Load() || c.rdClosed.Load() ||
		c.fatal.Load() != nil || atomic.LoadUint64(c.in.msgHead) != c.pool.msgTailSeen.Load() || readFlagsSet(c.in.flags)
}

// Release gives a message's slot back: a received message's slot returns to the sender; an
// unsent loan returns to the free slots.
func (c *Conn) Release(m *Message) error {
	if m == nil || m.c != c || m.done {
		return errBadMessageUse
	}
	p := &c.pool
	if !m.received {
		p.pmu.Lock()
		defer p.pmu.Unlock()
		if !p.loaned.has(m.slot) {
			return errBadMessageUse
		}
		p.loaned.clear(m.slot)
		p.free = append(p.free, m.slot)
		m.done, m.Data = true, nil
		return nil
	}
	if !c.enter() {
		return c.opErr("release", net.ErrClosed)
	}
	defer c.exit()
	p.cmu.Lock()
	defer p.cmu.Unlock()
	if !p.held.has(m.slot) {
		return errBadMessageUse
	}
	p.held.clear(m.slot)
	m.done, m.Data = true, nil
	n := p.slotCount
	putLE32(c.in.freeEnt, 4*(p.freeHead%n), m.slot)
	p.freeHead++
	// SYNC POINT with the load of free_head in the peer's reclaim: the free entry written above
	// is visible to it, and our reads of the slot happen before the peer reuses it.
	atomic.StoreUint64(c.in.freeHead, p.freeHead)
	c.notifyPeer()
	return nil
}

// Release is shorthand for m's connection's Release.
func (m *Message) Release() error {
	if m == nil || m.c == nil {
		return errBadMessageUse
	}
	return m.c.Release(m)
}
