package colo

// The byte ring of one direction (spec/WIRE.md section 5): the producer half and the consumer
// half, as rust/colo-ring/src/ring.rs has them.
//
// Each half keeps its own counter privately and a cached copy of the other side's, re-reading the
// shared counter only when the cache says full (producer) or empty (consumer). Both counters count
// bytes ever moved and wrap at 2^64; byte i lives at data[i % capacity]. Every value read from the
// segment is untrusted: a counter out of range is reported (ok false), never used as an index.
//
// Go's sync/atomic operations are sequentially consistent, stronger than the acquire/release the
// spec asks for; each one that orders other memory names its partner ("SYNC POINT with ...").

import "sync/atomic"

// direction addresses one direction block of the segment (spec section 4).
type direction struct {
	base                                             uint64
	head, tail, msgHead, msgTail, freeHead, freeTail *uint64
	flags, rflags                                    *uint32
	data                                             []byte
	msgEnt, freeEnt                                  []byte
	pool                                             []byte
}

func newDirection(seg []byte, l layout, base uint64) direction {
	d := direction{base: base}
	d.head = u64at(seg, base+dRingHead)
	d.flags = u32at(seg, base+dRingFlags)
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

// producer is the writing half of a byte ring. Only the goroutine holding Conn.wmu uses it.
type producer struct {
	head       uint64 // bytes ever written (the last value stored to ring_head)
	cachedTail uint64 // ring_tail when last read; head - cachedTail <= capacity always holds
}

// space returns the bytes that can be written now. It re-reads ring_tail only when the cached
// tail says the ring is full; ok is false when ring_tail is out of range (behind the cached one,
// or more than capacity behind head).
func (p *producer) space(d *direction, capacity uint64) (free uint64, ok bool) {
	used := p.head - p.cachedTail
	if used == capacity {
		// SYNC POINT with the store of ring_tail in the peer's consumer.read: its copies out of
		// the bytes it released happen before we overwrite them.
		t := atomic.LoadUint64(d.tail)
		if p.head-t > capacity || t-p.cachedTail > capacity {
			return 0, false
		}
		p.cachedTail = t
		used = p.head - t
	}
	return capacity - used, true
}

// write copies src into the ring and publishes it (ring_head). len(src) is at most what space
// returned.
func (p *producer) write(d *direction, capacity uint64, src []byte) {
	n := uint64(len(src))
	off := p.head & (capacity - 1) // a power of two: % without a division
	first := min(n, capacity-off)
	copy(d.data[off:off+first], src)
	copy(d.data[:n-first], src[first:])
	p.head += n
	// SYNC POINT with the load of ring_head in the peer's consumer.refresh: the bytes copied
	// above are visible to the consumer before it sees the new head.
	atomic.StoreUint64(d.head, p.head)
}

// consumer is the reading half of a byte ring. Only the goroutine holding Conn.rmu uses it.
type consumer struct {
	tail       uint64 // bytes ever read (the last value stored to ring_tail)
	cachedHead uint64 // ring_head when last read; cachedHead - tail <= capacity always holds
}

// cached returns the readable bytes as of the last refresh.
func (q *consumer) cached() uint64 { return q.cachedHead - q.tail }

// refresh re-reads ring_head and returns the readable bytes; ok is false when ring_head is out
// of range (behind the cached one, or more than capacity past tail).
func (q *consumer) refresh(d *direction, capacity uint64) (avail uint64, ok bool) {
	// SYNC POINT with the store of ring_head in the peer's producer.write: the bytes it
	// published are visible to the copies in read.
	h := atomic.LoadUint64(d.head)
	if h-q.tail > capacity || h-q.cachedHead > capacity {
		return 0, false
	}
	q.cachedHead = h
	return h - q.tail, true
}

// read copies up to len(dst) of the readable bytes (as of the last refresh) out and releases
// them (ring_tail). It returns the count and ring_tail before the read (for notifySpace).
func (q *consumer) read(d *direction, capacity uint64, dst []byte) (n, before uint64) {
	n = min(q.cachedHead-q.tail, uint64(len(dst)))
	off := q.tail & (capacity - 1)
	first := min(n, capacity-off)
	copy(dst, d.data[off:off+first])
	copy(dst[first:n], d.data[:n-first])
	before = q.tail
	q.tail += n
	// SYNC POINT with the load of ring_tail in the peer's producer.space: our copies out happen
	// before the producer overwrites these bytes.
	atomic.StoreUint64(d.tail, q.tail)
	return n, before
}

// wasFullBefore reports whether the ring was full when ring_tail was before, so that the
// producer may be waiting for space. It loads ring_head afresh.
func (q *consumer) wasFullBefore(d *direction, capacity, before uint64) bool {
	// SYNC POINT with the store of ring_head in the peer's producer.write (notifySpace says why
	// this load sees the head of a producer that went to sleep on a full ring).
	return atomic.LoadUint64(d.head)-before >= capacity
}
