package colo

// The ring halves over heap memory, growth and shrinking included (spec/WIRE.md section 5), as
// rust/colo-ring/tests/ring.rs checks them.

import (
	"bytes"
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// growingRing is one direction of a heap segment whose ring may grow to capacity, starting at
// minRingSize bytes, and its two halves.
func growingRing(capacity uint32) (*direction, *producer, *consumer) {
	lay := Geometry{RingCapacity: capacity}.layout()
	seg := make([]byte, lay.segmentSize)
	startRings(seg, lay)
	d := newDirection(seg, lay, headerSize)
	p := &producer{}
	p.start(&d, uint64(capacity))
	return &d, p, &consumer{size: minRingSize}
}

// pattern returns n bytes of a stream pattern starting at stream offset at.
func pattern(at, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((at + i) % 251)
	}
	return b
}

// produce writes as much of src as the ring takes now, as Write does; it asks to grow when the
// ring is full.
func produce(t *testing.T, d *direction, p *producer, capacity uint64, src []byte) int {
	t.Helper()
	free, bad := p.space(d, capacity)
	if bad != "" {
		t.Fatalf("space: %s", bad)
	}
	if free == 0 {
		p.askToGrow(d, capacity, capacity)
		return 0
	}
	n := min(free, uint64(len(src)))
	p.write(d, src[:n])
	return int(n)
}

// consume reads up to len(dst) bytes, refreshing when nothing is cached, as readSome does; until
// the ring is empty or dst full.
func consume(t *testing.T, d *direction, q *consumer, capacity uint64, dst []byte) int {
	t.Helper()
	got := 0
	for got < len(dst) {
		if q.cached() == 0 {
			if _, bad := q.refresh(d, capacity); bad != "" {
				t.Fatalf("refresh: %s", bad)
			}
		}
		n, _ := q.read(d, dst[got:])
		if n == 0 {
			break
		}
		got += int(n)
	}
	return got
}

// produceAll writes as much of src as the ring takes now (several writes, as Write makes them).
func produceAll(t *testing.T, d *direction, p *producer, capacity uint64, src []byte) int {
	t.Helper()
	sent := 0
	for sent < len(src) {
		n := produce(t, d, p, capacity, src[sent:])
		if n == 0 {
			break
		}
		sent += n
	}
	return sent
}

func TestRingFullGrowsWhenServedAndKeepsItsBytes(t *testing.T) {
	const capy = 1 << 20
	d, p, q := growingRing(capy)
	data := pattern(0, 1_000_000)
	sent := 0
	// Nothing is read: the ring must grow to take everything that fits in the region.
	for sent < len(data) {
		free, bad := p.space(d, capy)
		if bad != "" {
			t.Fatal(bad)
		}
		if free > 0 {
			n := min(int(free), len(data)-sent)
			p.write(d, data[sent:sent+n])
			sent += n
			continue
		}
		if !p.askToGrow(d, capy, capy) && p.size != capy {
			t.Fatalf("a full ring of %d bytes did not ask to grow", p.size)
		}
		if free, _ := p.space(d, capy); free != 0 {
			t.Fatalf("%d bytes free while the request stands", free)
		}
		grew, bad := q.serveGrowth(d, capy)
		if bad != "" {
			t.Fatal(bad)
		}
		if !grew {
			break
		}
	}
	if s := atomic.LoadUint32(d.size); s != capy || sent != len(data) {
		t.Fatalf("ring_size %d, %d of %d bytes sent", s, sent, len(data))
	}
	out := make([]byte, len(data))
	if n := consume(t, d, q, capy, out); n != len(data) || !bytes.Equal(out, data) {
		t.Fatalf("read %d bytes back, equal %v", n, bytes.Equal(out, data))
	}
}

func TestRingGrowsWithBytesWrapped(t *testing.T) {
	const capy = 1 << 16
	d, p, q := growingRing(capy)
	// Move the counters to 3000, so that the full ring's bytes wrap around its end.
	if n := produce(t, d, p, capy, pattern(0, 3000)); n != 3000 {
		t.Fatalf("wrote %d", n)
	}
	if n := consume(t, d, q, capy, make([]byte, 3000)); n != 3000 {
		t.Fatalf("read %d", n)
	}
	if n := produceAll(t, d, p, capy, pattern(3000, 4096)); n != 4096 {
		t.Fatalf("wrote %d", n)
	}
	if n := produce(t, d, p, capy, pattern(7096, 1)); n != 0 || p.pending != 8192 {
		t.Fatalf("a full ring wrote %d, pending %d", n, p.pending)
	}
	if grew, bad := q.serveGrowth(d, capy); !grew || bad != "" {
		t.Fatalf("serve: %v %q", grew, bad)
	}
	if n := produceAll(t, d, p, capy, pattern(7096, 5000)); n != 4096 || p.size != 8192 {
		t.Fatalf("after growth wrote %d at size %d", n, p.size)
	}
	out := make([]byte, 8192)
	if n := consume(t, d, q, capy, out); n != 8192 || !bytes.Equal(out, pattern(3000, 8192)) {
		t.Fatalf("read %d bytes, in order: %v", n, bytes.Equal(out[:n], pattern(3000, n)))
	}
}

func TestRingRequestTakenBackWhenRoomComesFirst(t *testing.T) {
	const capy = 1 << 16
	d, p, q := growingRing(capy)
	if n := produce(t, d, p, capy, pattern(0, 5000)); n != 4096 {
		t.Fatalf("wrote %d", n)
	}
	if !p.askToGrow(d, capy, capy) || atomic.LoadUint32(d.grow) != 8192 {
		t.Fatalf("asked: pending %d, ring_grow %d", p.pending, atomic.LoadUint32(d.grow))
	}
	if n := consume(t, d, q, capy, make([]byte, 100)); n != 100 {
		t.Fatalf("read %d", n)
	}
	if free, bad := p.space(d, capy); free != 100 || bad != "" {
		t.Fatalf("room again: %d free (%q), want the request withdrawn and 100", free, bad)
	}
	if g := atomic.LoadUint32(d.grow); g != 0 || p.pending != 0 {
		t.Fatalf("ring_grow %d, pending %d after taking the request back", g, p.pending)
	}
	if grew, _ := q.serveGrowth(d, capy); grew || p.size != 4096 {
		t.Fatalf("served a withdrawn request: grew %v, size %d", grew, p.size)
	}
}

func TestRingProducerWaitsWhileConsumerBusy(t *testing.T) {
	const capy = 1 << 16
	d, p, _ := growingRing(capy)
	produce(t, d, p, capy, pattern(0, 4096))
	if !p.askToGrow(d, capy, capy) {
		t.Fatal("did not ask")
	}
	// The consumer took the request and is moving bytes.
	if !atomic.CompareAndSwapUint32(d.grow, 8192, growBusy) {
		t.Fatal("no request to take")
	}
	if free, bad := p.space(d, capy); free != 0 || bad != "" || p.pending != 8192 {
		t.Fatalf("while BUSY: %d free (%q), pending %d", free, bad, p.pending)
	}
	atomic.StoreUint32(d.size, 8192)
	atomic.StoreUint32(d.grow, 0)
	if free, bad := p.space(d, capy); free != 4096 || bad != "" || p.size != 8192 {
		t.Fatalf("served: %d free (%q) at size %d", free, bad, p.size)
	}
}

func TestRingGrowthStopsAtTheLimit(t *testing.T) {
	const capy = 1 << 16
	d, p, q := growingRing(capy)
	for p.size < 16384 {
		produce(t, d, p, capy, pattern(0, 1<<16))
		if !p.askToGrow(d, capy, 16384) {
			if free, _ := p.space(d, capy); free == 0 && p.pending == 0 {
				t.Fatalf("a full ring of %d below the limit did not ask", p.size)
			}
		}
		q.serveGrowth(d, capy)
		p.space(d, capy)
	}
	produce(t, d, p, capy, pattern(0, 1<<16))
	if p.askToGrow(d, capy, 16384) || p.size != 16384 {
		t.Fatalf("asked beyond the limit: size %d pending %d", p.size, p.pending)
	}
}

func TestRingScribbledGrowthWordsAreCorruption(t *testing.T) {
	const capy = 1 << 16
	for _, v := range []struct{ size, grow uint32 }{
		{3000, 0}, {1 << 20, 0}, {4096, 12288}, {4096, 4096}, {4096, 1 << 20}, {0, 0},
	} {
		d, p, q := growingRing(capy)
		produce(t, d, p, capy, pattern(0, 10))
		atomic.StoreUint32(d.size, v.size)
		atomic.StoreUint32(d.grow, v.grow)
		var bad string
		if v.grow != 0 {
			_, bad = q.serveGrowth(d, capy)
		} else {
			_, bad = q.refresh(d, capy)
		}
		if bad == "" {
			t.Errorf("ring_size %d, ring_grow %d: accepted", v.size, v.grow)
		}
	}
	// A producer waiting for a size it never asked for.
	d, p, _ := growingRing(capy)
	produce(t, d, p, capy, pattern(0, 4096))
	if !p.askToGrow(d, capy, capy) {
		t.Fatal("did not ask")
	}
	atomic.StoreUint32(d.size, 16384)
	atomic.StoreUint32(d.grow, 0)
	if _, bad := p.space(d, capy); bad == "" {
		t.Error("a ring grown to a size not asked for was accepted")
	}
	// A request the producer never made, of a size other than its own.
	d, p, _ = growingRing(capy)
	produce(t, d, p, capy, pattern(0, 4096))
	p.askToGrow(d, capy, capy)
	atomic.StoreUint32(d.grow, 32768)
	if _, bad := p.space(d, capy); bad == "" {
		t.Error("a ring_grow the producer did not write was accepted")
	}
}

// Growth, taking a request back and shrinking, in any order with reads and writes: the stream
// stays a FIFO, and the ring never holds more than its current size.
func TestRingGrowingStaysAFIFO(t *testing.T) {
	const capy = 65536
	for seed := uint64(0); seed < 100; seed++ {
		r := rand.New(rand.NewPCG(seed, 23))
		d, p, q := growingRing(capy)
		var model []byte
		written := 0
		for k := 0; k < 300; k++ {
			n := 1 + r.IntN(40000)
			switch r.IntN(6) {
			case 0, 1:
				src := pattern(written, n)
				m := produce(t, d, p, capy, src)
				model = append(model, src[:m]...)
				written += m
			case 2:
				dst := make([]byte, n)
				m := consume(t, d, q, capy, dst)
				if m > len(model) || !bytes.Equal(dst[:m], model[:m]) {
					t.Fatalf("seed %d op %d: read %d bytes, not the next %d written", seed, k, m, len(model))
				}
				model = model[m:]
			case 3:
				if _, bad := q.serveGrowth(d, capy); bad != "" {
					t.Fatalf("seed %d op %d: serve: %s", seed, k, bad)
				}
			case 4:
				if _, bad := p.space(d, capy); bad != "" {
					t.Fatalf("seed %d op %d: space: %s", seed, k, bad)
				}
			default:
				from, to, bad := p.shrinkIfEmpty(d)
				if bad != "" || to != 0 && (len(model) != 0 || from != minRingSize) {
					t.Fatalf("seed %d op %d: shrank [%d, %d) with %d bytes in flight (%q)", seed, k, from, to, len(model), bad)
				}
			}
			if s := atomic.LoadUint32(d.size); uint32(len(model)) > s || s > capy {
				t.Fatalf("seed %d op %d: %d bytes in a ring of %d", seed, k, len(model), s)
			}
		}
		// Everything still comes out, in order.
		if _, bad := q.serveGrowth(d, capy); bad != "" {
			t.Fatal(bad)
		}
		rest := make([]byte, len(model)+1)
		if m := consume(t, d, q, capy, rest); m != len(model) || !bytes.Equal(rest[:m], model) {
			t.Fatalf("seed %d: the last read gave %d of %d bytes", seed, m, len(model))
		}
	}
}
