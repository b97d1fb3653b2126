package colo

// The byte ring of one direction (spec/WIRE.md section 5): the producer half and the consumer
// half, as rust/colo-ring/src/ring.rs has them.
//
// Each half keeps its own counter privately and a cached copy of the other side's, re-reading the
// shared counter only when the cache says full (producer) or empty (consumer). Both counters count
// bytes ever moved and wrap at 2^64; byte i lives at data[i % size], where size (ring_size) starts
// at 4 KiB and may grow to the data region's capacity (ring_capacity): the producer asks
// (ring_grow), the consumer moves the unread bytes to where the larger size puts them and answers,
// and the producer shrinks an empty ring back (spec section 5, "Growing and shrinking"). Every
// value read from the segment is untrusted: one out of range is reported (a non-empty reason),
// never used as an index.
//
// Go's sync/atomic operations are sequentially consistent, stronger than the acquire/release the
// spec asks for; each one that orders other memory names its partner ("SYNC POINT with ...").

import (
	"math/bits"
	"sync/atomic"
)

// direction addresses one direction block of the segment (spec section 4).
type direction struct {
	base                                             uint64
	head, tail, msgHead, msgTail, freeHead, freeTail *uint64
	flags, rflags, size, grow                        *uint32
	data                                             []byte
	msgEnt, freeEnt                                  []byte
	pool                                             []byte
}

func newDirection(seg []byte, l layout, base uint64) direction {
	d := direction{base: base}
	d.head = u64at(seg, base+dRingHead)
	d.flags = u32at(seg, base+dRingFlags)
	d.size = u32at(seg, base+dRingSize)
	d.grow = u32at(seg, base+dRingGrow)
	d.tail = u64at(seg, base+dRingTail)
	d.rflags = u32at(seg, base+dReadFlags)
	d.msgHead = u64at(seg, base+dMsgHead)
	d.msgTail = u64at(seg, base+dMsgTail)
	d.freeHead = u64at(seg, base+dFreeHead)
	d.freeTail = u64at(seg, base+dFreeTail)
	n := uint64(l.SlotCount)
	d.msgEnt = seg[base+dMsgEnt : base+dMsgEnt+8*n : base+dMsgEnt+8*n]
	fo := base + l.freeOff()
	d.freeEnt = seg[fo : fo+4*n : fo+4*n]
	d.data = seg[base+l.dataOff : base+l.poolOff : base+l.poolOff]
	pe := base + l.poolOff + n*uint64(l.SlotSize)
	d.pool = seg[base+l.poolOff : pe : pe]
	return d
}

// startRings makes both rings of a segment start at minRingSize bytes with no request pending:
// the segment's creator (the client) does so for a fresh or recycled segment before it sends
// HELLO, whose system call publishes the stores to the server.
func startRings(seg []byte, l layout) {
	for _, base := range []uint64{headerSize, headerSize + l.blockSize} {
		atomic.StoreUint32(u32at(seg, base+dRingSize), min(minRingSize, l.RingCapacity))
		atomic.StoreUint32(u32at(seg, base+dRingGrow), 0)
	}
}

// validSize returns a ring_size as the peer left it if it is a power of two from minRingSize
// (or the capacity, if smaller) to the data region's capacity; ok is false otherwise.
func validSize(size uint32, capacity uint64) (uint64, bool) {
	s := uint64(size)
	return s, bits.OnesCount64(s) == 1 && (s >= minRingSize || s == capacity) && s <= capacity
}

// askedUnknown is the pending size of a producer that found a request standing when it took
// over the ring, with the consumer already serving it: only that it is larger is known.
const askedUnknown = ^uint64(0)

// Reasons a ring half reports corruption.
const (
	badTail    = "ring tail out of range"
	badHead    = "ring head out of range"
	badSize    = "ring_size out of range"
	badGrow    = "ring_grow out of range"
	badGrownTo = "ring grown to a size not asked for"
)

// producer is the writing half of a byte ring. Only the goroutine holding Conn.wmu uses it (and
// the shrinker, which holds it too).
type producer struct {
	head       uint64 // bytes ever written (the last value stored to ring_head)
	cachedTail uint64 // ring_tail when last read; head - cachedTail <= size always holds
	size       uint64 // the ring's size (ring_size) as we last adopted it; 0: it was invalid
	pending    uint64 // the size asked for in ring_grow while the request stands; 0: none
}

// start adopts the ring's size and any request standing (spec section 5: a request found on
// taking the ring over is treated as our own).
func (p *producer) start(d *direction, capacity uint64) {
	if s, ok := validSize(atomic.LoadUint32(d.size), capacity); ok {
		p.size = s
	}
	switch g := atomic.LoadUint32(d.grow); g {
	case 0:
	case growBusy:
		p.pending = askedUnknown
	default:
		p.pending = uint64(g)
	}
}

// refresh re-reads ring_tail and returns the free bytes; bad names the corruption, if any.
func (p *producer) refresh(d *direction) (free uint64, bad string) {
	if p.size == 0 {
		return 0, badSize
	}
	// SYNC POINT with the store of ring_tail in the peer's consumer.read: its copies out of the
	// bytes it released happen before we overwrite them.
	t := atomic.LoadUint64(d.tail)
	if p.head-t > p.size || t-p.cachedTail > p.size {
		return 0, badTail
	}
	p.cachedTail = t
	return p.size - (p.head - t), ""
}

// settle looks at a standing growth request: served (adopt the new size), still waiting for the
// consumer, or taken back because the ring has room again. Afterwards pending is 0 if and only
// if the producer may write.
func (p *producer) settle(d *direction, capacity uint64) string {
	// SYNC POINT with the store of 0 in the peer's consumer.serveGrowth: its moves of the
	// unread bytes, and the new ring_size, are seen before we write beside them.
	g := atomic.LoadUint32(d.grow)
	switch {
	case g == 0:
		s, ok := validSize(atomic.LoadUint32(d.size), capacity)
		if !ok {
			return badSize
		}
		if !(p.pending == askedUnknown && s > p.size || s == p.pending) {
			return badGrownTo
		}
		p.size, p.pending = s, 0
	case g == growBusy:
	case uint64(g) == p.pending || p.pending == askedUnknown:
		// Not taken yet. With room again (the consumer read before it saw the request), write
		// now rather than wait for a consumer that may not come back soon.
		free, bad := p.refresh(d)
		if bad != "" {
			return bad
		}
		// SYNC POINT with the consumer's CompareAndSwap in serveGrowth: exactly one of the two
		// takes the request.
		if free > 0 && atomic.CompareAndSwapUint32(d.grow, g, 0) {
			p.pending = 0
		}
	default:
		return badGrow
	}
	return ""
}

// space returns the bytes that can be written now: 0 while a growth request stands. It re-reads
// ring_tail only when the cached tail says the ring is full.
func (p *producer) space(d *direction, capacity uint64) (free uint64, bad string) {
	if p.pending != 0 {
		if bad := p.settle(d, capacity); bad != "" {
			return 0, bad
		}
		if p.pending != 0 {
			return 0, ""
		}
	}
	used := p.head - p.cachedTail
	if used == p.size {
		return p.refresh(d)
	}
	return p.size - used, ""
}

// askToGrow asks the consumer to double the ring, if it is full (space returned 0), smaller than
// limit and the data region, and no request stands. True if asked: the caller then wakes the
// peer, whatever it sleeps for, and writes nothing until space says so.
func (p *producer) askToGrow(d *direction, capacity, limit uint64) bool {
	if p.pending != 0 || p.size == 0 || p.size >= min(limit, capacity) {
		return false
	}
	target := 2 * p.size
	// SYNC POINT with the CompareAndSwap in the peer's consumer.serveGrowth (which loads
	// ring_head afresh for the bytes it moves: the request itself publishes nothing else).
	atomic.StoreUint32(d.grow, uint32(target))
	p.pending = target
	return true
}

// shrinkIfEmpty shrinks an empty ring back to minRingSize bytes and returns the part of the data
// region whose pages may now be given back to the system; nothing (to == 0) if bytes are in
// flight, a request stands, or the ring is already small.
func (p *producer) shrinkIfEmpty(d *direction) (from, to uint64, bad string) {
	if p.pending != 0 || p.size <= minRingSize {
		return 0, 0, ""
	}
	free, bad := p.refresh(d)
	if bad != "" || free != p.size || atomic.LoadUint32(d.grow) != 0 {
		return 0, 0, bad
	}
	// The consumer reads ring_size after its load of a ring_head we publish later (write's
	// store), and nothing is readable before then: SYNC POINT with that load, in refresh.
	atomic.StoreUint32(d.size, minRingSize)
	from, to = minRingSize, p.size
	p.size = minRingSize
	return from, to, ""
}

// write copies src into the ring and publishes it (ring_head). len(src) is at most what space
// returned.
func (p *producer) write(d *direction, src []byte) {
	n := uint64(len(src))
	off := p.head & (p.size - 1) // a power of two: % without a division
	first := min(n, p.size-off)
	copy(d.data[off:off+first], src)
	copy(d.data[:n-first], src[first:])
	p.head += n
	// SYNC POINT with the load of ring_head in the peer's consumer.refresh: the bytes copied
	// above (and a ring_size stored since its last load) are visible to the consumer before it
	// sees the new head.
	atomic.StoreUint64(d.head, p.head)
}

// consumer is the reading half of a byte ring. Only the goroutine holding Conn.rmu uses it.
type consumer struct {
	tail       uint64 // bytes ever read (the last value stored to ring_tail)
	cachedHead uint64 // ring_head when last read; cachedHead - tail <= size always holds
	size       uint64 // the size the bytes up to cachedHead were written at
}

// cached returns the readable bytes as of the last refresh.
func (q *consumer) cached() uint64 { return q.cachedHead - q.tail }

// refresh re-reads ring_head and ring_size and returns the readable bytes; bad names the
// corruption, if any.
func (q *consumer) refresh(d *direction, capacity uint64) (avail uint64, bad string) {
	// SYNC POINT with the store of ring_head in the peer's producer.write: the bytes it
	// published are visible to the copies in read.
	h := atomic.LoadUint64(d.head)
	// After the head: a size the producer stored before publishing h is seen. The size changes
	// only while the ring is empty (the producer shrinks it) or by our own hand (growth), so it
	// holds for every byte up to h.
	s, ok := validSize(atomic.LoadUint32(d.size), capacity)
	if !ok {
		return 0, badSize
	}
	if h-q.tail > s || h-q.cachedHead > s {
		return 0, badHead
	}
	q.cachedHead, q.size = h, s
	return h - q.tail, ""
}

// read copies up to len(dst) of the readable bytes (as of the last refresh) out and releases
// them (ring_tail). It returns the count and ring_tail before the read (for notifySpace).
func (q *consumer) read(d *direction, dst []byte) (n, before uint64) {
	n = min(q.cachedHead-q.tail, uint64(len(dst)))
	off := q.tail & (q.size - 1)
	first := min(n, q.size-off)
	copy(dst, d.data[off:off+first])
	copy(dst[first:n], d.data[:n-first])
	before = q.tail
	q.tail += n
	// SYNC POINT with the load of ring_tail in the peer's producer.refresh: our copies out
	// happen before the producer overwrites these bytes.
	atomic.StoreUint64(d.tail, q.tail)
	return n, before
}

// wasFullBefore reports whether the ring was full when ring_tail was before, so that the
// producer may be waiting for space. It loads ring_head afresh.
func (q *consumer) wasFullBefore(d *direction, before uint64) bool {
	// SYNC POINT with the store of ring_head in the peer's producer.write (notifySpace says why
	// this load sees the head of a producer that went to sleep on a full ring).
	return atomic.LoadUint64(d.head)-before >= q.size
}

// growthAsked reports whether the producer asks for the ring to grow (a request not taken yet):
// a hint to call serveGrowth, which validates it.
func growthAsked(d *direction) bool {
	g := atomic.LoadUint32(d.grow) // a hint: serveGrowth's CompareAndSwap is the SYNC POINT
	return g != 0 && g != growBusy
}

// serveGrowth grows the ring if the producer asks: moves the unread bytes to where the larger
// size puts them, then answers. grew: the caller wakes the peer, whatever it sleeps for.
func (q *consumer) serveGrowth(d *direction, capacity uint64) (grew bool, bad string) {
	target := atomic.LoadUint32(d.grow)
	if target == 0 || target == growBusy {
		return false, ""
	}
	old, ok := validSize(atomic.LoadUint32(d.size), capacity)
	if !ok {
		return false, badSize
	}
	t := uint64(target)
	if bits.OnesCount64(t) != 1 || t <= old || t > capacity {
		return false, badGrow
	}
	// SYNC POINT with the store of the request in the peer's producer.askToGrow. Failing, the
	// producer took the request back (it had room again).
	if !atomic.CompareAndSwapUint32(d.grow, target, growBusy) {
		return false, ""
	}
	// SYNC POINT with the store of ring_head in the peer's producer.write: every byte we move
	// was published. The producer writes nothing while the request stands.
	h := atomic.LoadUint64(d.head)
	if h-q.tail > old {
		return false, badHead
	}
	// Byte i moves from data[i % old] to data[i % t]: sources are below old, destinations at
	// or above it (or where they are already), so no move overwrites a byte still to move.
	for i := q.tail; i != h; {
		from, to := i&(old-1), i&(t-1)
		run := min(h-i, old-from, t-to)
		if from != to {
			copy(d.data[to:to+run], d.data[from:from+run])
		}
		i += run
	}
	q.size, q.cachedHead = t, h
	atomic.StoreUint32(d.size, target)
	// SYNC POINT with the load of ring_grow in the peer's producer.settle: the moves and the new
	// ring_size are seen by the producer before it writes at the new size.
	atomic.StoreUint32(d.grow, 0)
	return true, ""
}
