package colo

// The byte ring of one direction (spec/WIRE.md section 5): the producer half and the consumer
// half, as rust/colo-ring/src/ring.rs has them.
//
// Each half keeps its own counter privately and a cached copy of the other side's, re-reading the
// shared counter only when the cache says full (producer) or empty (consumer). Both counters count
// bytes ever moved and wrap at 2^64; byte i lives at data[i % size], where size (ring_size) starts
// at 4 KiB and may grow to the data region's capacity (ring_capacity). Only the producer changes
// the size (spec section 5, "Growing and shrinking"): it grows the ring when a write does not fit,
// moving the unread bytes to where the larger size puts them, and shrinks it when empty; the
// consumer's copy counts only if ring_size did not change during it (a sequence lock whose
// sequence number is the size). Every value read from the segment is untrusted: one out of range
// is reported (a non-empty reason), never used as an index.
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
	flags, rflags, size, spaceWake                   *uint32
	data                                             []byte
	// spare is data and the padding after it, up to the pool, which starts on a page of its own:
	// the part of the block whose pages the ring may give back.
	spare           []byte
	msgEnt, freeEnt []byte
	pool            []byte
	// file is the segment's memfd where the consumer reads data with pread instead of through
	// the mapping (Conn.readThrough: a peer of another user), else -1; fileOff is where data
	// starts in it.
	file    int
	fileOff uint64
}

func newDirection(seg []byte, l layout, base uint64) direction {
	d := direction{base: base, file: -1}
	d.head = u64at(seg, base+dRingHead)
	d.flags = u32at(seg, base+dRingFlags)
	d.size = u32at(seg, base+dRingSize)
	d.spaceWake = u32at(seg, base+dSpaceWake)
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
	d.spare = seg[base+l.dataOff : base+l.poolOff : base+l.poolOff]
	pe := base + l.poolOff + n*uint64(l.SlotSize)
	d.pool = seg[base+l.poolOff : pe : pe]
	return d
}

// startRings makes both rings of a segment start at minRingSize bytes: the segment's creator (the
// client) does so for a fresh or recycled segment before it sends HELLO, whose system call
// publishes the stores to the server.
func startRings(seg []byte, l layout) {
	for _, base := range []uint64{headerSize, headerSize + l.blockSize} {
		atomic.StoreUint32(u32at(seg, base+dRingSize), min(minRingSize, l.RingCapacity))
		atomic.StoreUint32(u32at(seg, base+dSpaceWake), 0)
	}
}

// validSize returns a ring_size as the peer left it if it is a power of two from minRingSize
// (or the capacity, if smaller) to the data region's capacity; ok is false otherwise.
func validSize(size uint32, capacity uint64) (uint64, bool) {
	s := uint64(size)
	return s, bits.OnesCount64(s) == 1 && (s >= minRingSize || s == capacity) && s <= capacity
}

// maxRereads is how many times in a row one read may find the ring grown under its copy before
// the peer counts as corrupting the segment: an honest producer grows a ring a few times in its
// life (each time at least doubling it) and never shrinks it under a read.
const maxRereads = 64

// Reasons a ring half reports corruption.
const (
	badTail    = "ring tail out of range"
	badHead    = "ring head out of range"
	badSize    = "ring_size out of range"
	badRereads = "ring_size changes under every read"
)

// producer is the writing half of a byte ring. Only the goroutine holding Conn.wmu uses it (the
// shrinker holds it too).
type producer struct {
	head       uint64 // bytes ever written (the last value stored to ring_head)
	cachedTail uint64 // ring_tail when last read; head - cachedTail <= size always holds
	size       uint64 // the ring's size; ring_size holds it (only we write it); 0: it was invalid
	spaceWake  uint64 // the space_wake we last stored; 0: none yet (any free byte)
}

// markSpaceWake stores space_wake: seven eighths of the ring's size or of the limit, whichever
// is smaller, so that the consumer wakes a writer waiting for space once, when an eighth of what
// it may fill is free (TCP wakes a writer once a sixth of its and its peer's buffers is), on the read that takes
// the unread bytes down to that mark (spec section 6), rather than at every read. A plain store:
// our announcement of a sleep (the OR of our waiting word) comes after it, and it changes only
// while we write, never while we wait.
func (p *producer) markSpaceWake(d *direction, limit uint64) {
	fill := min(p.size, max(limit, minRingSize))
	if mark := fill - max(fill/8, 1); mark != p.spaceWake {
		p.spaceWake = mark
		atomic.StoreUint32(d.spaceWake, uint32(mark))
	}
}

// start adopts the ring's size as its creator set it.
func (p *producer) start(d *direction, capacity uint64) {
	if s, ok := validSize(atomic.LoadUint32(d.size), capacity); ok {
		p.size = s
	}
}

// refresh re-reads ring_tail and returns the free bytes at the current size; bad names the
// corruption, if any.
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

// space returns the bytes that can be written now, counting what growing the ring up to limit
// would make room for: a writer waits only when the ring is full at its limit. It re-reads
// ring_tail only when the cache says the ring is full at that size. Never more than bound
// bytes are unread (see fit).
func (p *producer) space(d *direction, limit, bound uint64) (free uint64, bad string) {
	if p.size > bound {
		if bad = p.fit(d, limit); bad != "" {
			return 0, bad
		}
	}
	room := min(max(p.size, limit), bound)
	if used := p.head - p.cachedTail; used < room {
		return room - used, ""
	}
	free, bad = p.refresh(d)
	if used := p.size - free; used < room {
		return room - used, bad
	}
	return 0, bad
}

// fit takes a ring larger than its bound down to limit once it is empty (a producer may shrink
// an empty ring, spec section 5); until then space fills it only to the bound. Its size was not
// ours to choose: start adopts ring_size as the segment's creator, the peer, left it, and a
// peer that wrote a larger size and never reads must hold no more of our memory than the bound.
func (p *producer) fit(d *direction, limit uint64) (bad string) {
	free, bad := p.refresh(d)
	if bad != "" || free != p.size {
		return bad
	}
	// SYNC POINT with the loads of ring_size in the peer's consumer, as in shrinkIfEmpty:
	// nothing is readable.
	atomic.SwapUint32(d.size, uint32(limit))
	atomic.LoadUint32(d.size) // as in grow
	p.size = limit
	p.markSpaceWake(d, limit)
	return ""
}

// grow makes the ring large enough for want more bytes beside the unread ones: the smallest power
// of two that holds them, at most max(limit, size). The unread bytes whose place changes move
// to the new part of the region (byte i from data[i % old] to data[i % new]), which no reader of
// the old size looks at; a consumer that copied with the old size sees ring_size changed after
// its copy and copies again (consumer.read).
func (p *producer) grow(d *direction, want, limit uint64) {
	used := p.head - p.cachedTail
	target := min(uint64(1)<<bits.Len64(used+want-1), max(limit, p.size))
	old := p.size
	if target <= old {
		return
	}
	// Sources lie below old, destinations at or above it (or where they are already), so no
	// move overwrites a byte still to move.
	for i := p.cachedTail; i != p.head; {
		from, to := i&(old-1), i&(target-1)
		run := min(p.head-i, old-from, target-to)
		if from != to {
			copy(d.data[to:to+run], d.data[from:from+run])
		}
		i += run
	}
	// SYNC POINT with the loads of ring_size in the peer's consumer.refresh (a consumer that
	// sees the new size sees the bytes moved) and consumer.read (a consumer whose copy with the
	// old size saw a byte we write from here on sees the new size after its copy). A swap, not
	// a store, then a load: on arm64 without LSE the swap is a store-release, which orders only
	// what came before it; the load-acquire after it keeps our later writes of data after it
	// (the spec's release fence).
	atomic.SwapUint32(d.size, uint32(target))
	atomic.LoadUint32(d.size)
	p.size = target
	p.markSpaceWake(d, limit)
}

// shrinkIfEmpty shrinks an empty ring back to minRingSize bytes and returns the part of the data
// region whose pages may now be given back to the system; nothing (to == 0) if bytes are in
// flight or the ring is already small.
func (p *producer) shrinkIfEmpty(d *direction) (from, to uint64, bad string) {
	if p.size <= minRingSize {
		return 0, 0, ""
	}
	free, bad := p.refresh(d)
	if bad != "" || free != p.size {
		return 0, 0, bad
	}
	// SYNC POINT with the loads of ring_size in the peer's consumer, as in grow: nothing is
	// readable, so a consumer that copies with the old size copies nothing, or bytes we publish
	// later, and then sees the size changed.
	atomic.SwapUint32(d.size, minRingSize)
	atomic.LoadUint32(d.size) // as in grow
	from, to = minRingSize, p.size
	p.size = minRingSize
	p.markSpaceWake(d, minRingSize)
	return from, to, ""
}

// write copies src into the ring and publishes it (ring_head), growing the ring first if src
// does not fit at the current size. len(src) is at most what space returned for limit.
func (p *producer) write(d *direction, src []byte, limit uint64) (bad string) {
	n := uint64(len(src))
	if p.size-(p.head-p.cachedTail) < n {
		free, bad := p.refresh(d)
		if bad != "" {
			return bad
		}
		if free < n {
			p.grow(d, n, limit)
		}
	}
	off := p.head & (p.size - 1) // a power of two: % without a division
	first := min(n, p.size-off)
	copy(d.data[off:off+first], src)
	copy(d.data[:n-first], src[first:])
	p.head += n
	// SYNC POINT with the load of ring_head in the peer's consumer.refresh: the bytes copied
	// above are visible to the consumer before it sees the new head.
	atomic.StoreUint64(d.head, p.head)
	return ""
}

// consumer is the reading half of a byte ring. Only the goroutine holding Conn.rmu uses it.
type consumer struct {
	tail       uint64 // bytes ever read (the last value stored to ring_tail)
	cachedHead uint64 // ring_head when last read
	// ring_size read with cachedHead: where the bytes up to it lie, unless the producer grew the
	// ring since (read checks).
	size  uint64
	fence uint32 // the word readFence modifies (ours alone)
}

// cached returns the readable bytes as of the last refresh.
func (q *consumer) cached() uint64 { return q.cachedHead - q.tail }

// refresh re-reads ring_size and ring_head and returns the readable bytes; bad names the
// corruption, if any.
func (q *consumer) refresh(d *direction, capacity uint64) (avail uint64, bad string) {
	// SYNC POINT with the store of ring_head in the peer's producer.write: the bytes it
	// published are visible to the copies in read, and so is the size they were written at.
	h := atomic.LoadUint64(d.head)
	// SYNC POINT with the swaps of ring_size in the peer's producer.grow and shrinkIfEmpty:
	// bytes moved for this size are visible. Loaded after the head, it is the size those bytes
	// were written at or a later, larger one (the ring cannot shrink while bytes are unread);
	// loaded first, a shrink and a regrow to the same size between the loads could pass read's
	// check with the bytes read from the wrong place.
	s, ok := validSize(atomic.LoadUint32(d.size), capacity)
	if !ok {
		return 0, badSize
	}
	if h-q.tail > capacity || h-q.cachedHead > capacity {
		return 0, badHead
	}
	q.cachedHead, q.size = h, s
	return h - q.tail, ""
}

// read copies up to len(dst) readable bytes out and releases them (ring_tail); it returns the
// count and ring_tail before the read (for notifySpace). The producer may grow the ring (moving
// unread bytes) at any time, so a copy counts only if ring_size still holds the size it was made
// with; otherwise it is made again at the new size.
func (q *consumer) read(d *direction, capacity uint64, dst []byte) (n, before uint64, bad string) {
	for range maxRereads {
		avail := q.cached()
		if avail == 0 {
			if avail, bad = q.refresh(d, capacity); bad != "" || avail == 0 {
				return 0, q.tail, bad
			}
		}
		if avail > q.size {
			// More than the size read allows: published under a size not yet seen.
			q.cachedHead = q.tail
			continue
		}
		n = min(avail, uint64(len(dst)))
		off := q.tail & (q.size - 1)
		first := min(n, q.size-off)
		if d.file >= 0 {
			d.loadFile(dst[:first], off)
			d.loadFile(dst[first:n], 0)
		} else {
			copy(dst, d.data[off:off+first])
			copy(dst[first:n], d.data[:n-first])
		}
		readFence(&q.fence)
		// After the same fence: the producer sets DROPPED before it gives back the pages of its
		// unread bytes (orphan.go), so a copy that saw a page gone (zeros) sees the flag here
		// and hands on nothing; the caller reports the reset.
		if atomic.LoadUint32(d.flags)&flagDropped != 0 {
			q.cachedHead = q.tail
			return 0, q.tail, ""
		}
		// SYNC POINT with the swap of ring_size in the peer's producer.grow: if the copy saw a
		// byte the producer wrote after growing, this load sees the grown size.
		if uint64(atomic.LoadUint32(d.size)) != q.size {
			q.cachedHead = q.tail
			continue
		}
		before = q.tail
		q.tail += n
		// SYNC POINT with the load of ring_tail in the peer's producer.refresh: our copies out
		// happen before the producer overwrites these bytes.
		atomic.StoreUint64(d.tail, q.tail)
		return n, before, ""
	}
	return 0, q.tail, badRereads
}

// loadFile copies data[at:at+len(dst)] into dst with pread of the memfd (d.file), which gives
// zeros for a page the producer never wrote (a hole) and allocates nothing, where a read
// through the mapping makes the kernel allocate that page, charged to us for as long as the
// peer keeps the memfd. A short read of the file (the memfd is sealed at the segment's size, so
// none is expected) or an error leaves the rest to the mapping, which holds the same bytes.
func (d *direction) loadFile(dst []byte, at uint64) {
	k := preadFull(d.file, dst, d.fileOff+at)
	copy(dst[k:], d.data[at+uint64(k):at+uint64(len(dst))])
}

// spaceWakeCrossed reports whether a read that moved ring_tail from before to where it is now
// should wake a producer waiting for space: it took the unread bytes from above the producer's
// space_wake mark to at most it. A mark of 0 means "any free byte": the ring was full before the
// read (with the smaller of our size and the current one: a stale smaller size only costs a
// futile wake-up). The producer waits with ring_head fixed, so the wake-up is due on the read
// that crosses the mark, and a peer waiting for our bytes instead is left asleep.
func (q *consumer) spaceWakeCrossed(d *direction, before uint64) bool {
	mark := uint64(atomic.LoadUint32(d.spaceWake)) // ordered as the head load below
	if mark == 0 {
		mark = min(uint64(atomic.LoadUint32(d.size)), q.size) - 1 // no ordering needed: a bound
	}
	// SYNC POINT with the store of ring_head in the peer's producer.write (notifySpace says why
	// this load sees the head of a producer that went to sleep on a full ring).
	h := atomic.LoadUint64(d.head)
	return h-before > mark && h-q.tail <= mark
}
