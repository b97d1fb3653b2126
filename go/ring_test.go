package colo

// The ring halves over memory of their own, growth and shrinking included (spec/WIRE.md section
// 5), as rust/colo-ring/tests/ring.rs checks them.

import (
	"bytes"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// growingRing is one direction of a segment whose ring may grow to capacity, starting at
// minRingSize bytes, and its two halves. The segment is mapped memory, as a real one is (the
// reader and writer of a concurrent test touch it without Go's synchronisation, as two processes
// do).
func growingRing(t *testing.T, capacity uint32) (*direction, *producer, *consumer) {
	t.Helper()
	lay := Geometry{RingCapacity: capacity}.layout()
	seg, err := unix.Mmap(-1, 0, int(lay.segmentSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(seg) })
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

// produce writes as much of src as the ring takes now (growing it up to limit), as Write does.
func produce(t *testing.T, d *direction, p *producer, limit uint64, src []byte) int {
	t.Helper()
	sent := 0
	for sent < len(src) {
		free, bad := p.space(d, limit, uint64(len(d.data)))
		if bad != "" {
			t.Fatalf("space: %s", bad)
		}
		if free == 0 {
			break
		}
		n := min(free, uint64(len(src)-sent), maxPublishChunk)
		if bad := p.write(d, src[sent:sent+int(n)], limit); bad != "" {
			t.Fatalf("write: %s", bad)
		}
		sent += int(n)
	}
	return sent
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
		n, _, bad := q.read(d, capacity, dst[got:])
		if bad != "" {
			t.Fatalf("read: %s", bad)
		}
		if n == 0 {
			break
		}
		got += int(n)
	}
	return got
}

func TestRingGrowsWithWrappedUnreadBytes(t *testing.T) {
	const capy = 1 << 16
	d, p, q := growingRing(t, capy)
	// Move the counters to 3000, so that the full ring's bytes wrap around its end.
	if n := produce(t, d, p, 4096, pattern(0, 3000)); n != 3000 {
		t.Fatalf("wrote %d", n)
	}
	if n := consume(t, d, q, capy, make([]byte, 3000)); n != 3000 {
		t.Fatalf("read %d", n)
	}
	if n := produce(t, d, p, 4096, pattern(3000, 5000)); n != 4096 || p.size != 4096 {
		t.Fatalf("at a 4 KiB limit wrote %d at size %d", n, p.size)
	}
	// The ring is full with bytes 3000..7096, wrapped: a write of 5000 more grows it to 16 KiB.
	if n := produce(t, d, p, capy, pattern(7096, 5000)); n != 5000 || p.size != 16384 {
		t.Fatalf("wrote %d at size %d, want 5000 at 16384", n, p.size)
	}
	if s := atomic.LoadUint32(d.size); s != 16384 {
		t.Fatalf("ring_size %d", s)
	}
	out := make([]byte, 9096)
	if n := consume(t, d, q, capy, out); n != 9096 || !bytes.Equal(out, pattern(3000, 9096)) {
		t.Fatalf("read %d bytes, in order: %v", n, bytes.Equal(out[:n], pattern(3000, n)))
	}
}

func TestRingGrowsUpToTheLimitAndNoFurther(t *testing.T) {
	const capy = 1 << 20
	d, p, q := growingRing(t, capy)
	// Nothing is read: the ring grows to take everything the limit allows.
	data := pattern(0, 2<<20)
	if n := produce(t, d, p, 1<<18, data); n != 1<<18 || p.size != 1<<18 {
		t.Fatalf("at a 256 KiB limit wrote %d at size %d", n, p.size)
	}
	if free, _ := p.space(d, 1<<18, capy); free != 0 {
		t.Fatalf("%d bytes free in a full ring at its limit", free)
	}
	if n := produce(t, d, p, capy, data[1<<18:]); n != capy-1<<18 || p.size != capy {
		t.Fatalf("at the capacity wrote %d more at size %d", n, p.size)
	}
	out := make([]byte, capy)
	if n := consume(t, d, q, capy, out); n != capy || !bytes.Equal(out, data[:capy]) {
		t.Fatalf("read %d bytes back, equal %v", n, bytes.Equal(out[:n], data[:n]))
	}
}

func TestRingShrinksOnlyWhenEmpty(t *testing.T) {
	const capy = 1 << 16
	d, p, q := growingRing(t, capy)
	produce(t, d, p, capy, pattern(0, 20000))
	if _, to, _ := p.shrinkIfEmpty(d); to != 0 {
		t.Fatal("shrank with bytes in flight")
	}
	consume(t, d, q, capy, make([]byte, 20000))
	from, to, bad := p.shrinkIfEmpty(d)
	if from != minRingSize || to != 32768 || bad != "" || atomic.LoadUint32(d.size) != minRingSize {
		t.Fatalf("shrink of an empty 32 KiB ring: [%d, %d) %q, ring_size %d", from, to, bad, atomic.LoadUint32(d.size))
	}
	// Writes and reads go on at the small size.
	if n := produce(t, d, p, 4096, pattern(20000, 5000)); n != 4096 {
		t.Fatalf("wrote %d after shrinking", n)
	}
	out := make([]byte, 4096)
	if n := consume(t, d, q, capy, out); n != 4096 || !bytes.Equal(out, pattern(20000, 4096)) {
		t.Fatalf("read %d after shrinking", n)
	}
}

func TestRingScribbledSizeIsCorruption(t *testing.T) {
	const capy = 1 << 16
	for _, size := range []uint32{0, 3000, 1024, 12288, 1 << 17, 1 << 20} {
		d, p, q := growingRing(t, capy)
		produce(t, d, p, capy, pattern(0, 10))
		atomic.StoreUint32(d.size, size)
		if _, bad := q.refresh(d, capy); bad == "" {
			t.Errorf("ring_size %d: accepted", size)
		}
	}
	// A copy made with a size that then changed is made again at the new size.
	d, p, q := growingRing(t, capy)
	produce(t, d, p, capy, pattern(0, 100))
	q.refresh(d, capy)
	q.size = 8192 // as if read just before the producer shrank the ring
	out := make([]byte, 100)
	if n, _, bad := q.read(d, capy, out); n != 100 || bad != "" || !bytes.Equal(out, pattern(0, 100)) {
		t.Fatalf("after the size changed: %d bytes (%q), equal %v", n, bad, bytes.Equal(out, pattern(0, 100)))
	}
}

// Writes (growing the ring up to varying limits), reads and shrinks in any order: the stream stays
// a FIFO, and the ring never holds more than its current size.
func TestRingGrowingStaysAFIFO(t *testing.T) {
	const capy = 65536
	for seed := uint64(0); seed < 100; seed++ {
		r := rand.New(rand.NewPCG(seed, 23))
		d, p, q := growingRing(t, capy)
		var model []byte
		written := 0
		for k := 0; k < 300; k++ {
			n := 1 + r.IntN(40000)
			switch r.IntN(5) {
			case 0, 1:
				limit := uint64(minRingSize) << r.IntN(5)
				src := pattern(written, n)
				m := produce(t, d, p, limit, src)
				model = append(model, src[:m]...)
				written += m
			case 2, 3:
				dst := make([]byte, n)
				m := consume(t, d, q, capy, dst)
				if m > len(model) || !bytes.Equal(dst[:m], model[:m]) {
					t.Fatalf("seed %d op %d: read %d bytes, not the next of the %d written", seed, k, m, len(model))
				}
				model = model[m:]
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
		rest := make([]byte, len(model)+1)
		if m := consume(t, d, q, capy, rest); m != len(model) || !bytes.Equal(rest[:m], model) {
			t.Fatalf("seed %d: the last read gave %d of %d bytes", seed, m, len(model))
		}
	}
}

// A reader reading while the writer grows the ring under it: every byte arrives, in order.
func TestRingGrowsUnderAConcurrentReader(t *testing.T) {
	watchdog(t, 60*time.Second)
	const capy = 1 << 22
	const total = 16 << 20
	d, p, q := growingRing(t, capy)
	done := make(chan string, 1)
	go func() {
		r := rand.New(rand.NewPCG(7, 7))
		buf := make([]byte, 1<<20)
		for got := 0; got < total; {
			if q.cached() == 0 {
				if _, bad := q.refresh(d, capy); bad != "" {
					done <- bad
					return
				}
			}
			n, _, bad := q.read(d, capy, buf[:1+r.IntN(len(buf))])
			if bad != "" {
				done <- bad
				return
			}
			for i := 0; i < int(n); i++ {
				if buf[i] != byte((got+i)%251) {
					done <- "a byte out of order"
					return
				}
			}
			got += int(n)
		}
		done <- ""
	}()
	r := rand.New(rand.NewPCG(8, 8))
	src := pattern(0, total)
	for sent, shrinks := 0, 0; sent < total; {
		// Varied write sizes; now and then the reader catches up and the ring shrinks.
		n := min(1+r.IntN(3<<20), total-sent)
		sent += produce(t, d, p, capy, src[sent:sent+n])
		if r.IntN(8) == 0 && shrinks < 50 {
			if _, to, _ := p.shrinkIfEmpty(d); to != 0 {
				shrinks++
			}
		}
	}
	if bad := <-done; bad != "" {
		t.Fatal(bad)
	}
}

// A peer that made the segment with our ring at its largest size holds no more than our
// bound unread: an empty ring found too large goes down to the limit at the first write.
func TestRingSizeThePeerWroteHoldsNoMoreThanTheBound(t *testing.T) {
	const capy = 1 << 16
	d, p, q := growingRing(t, capy)
	atomic.StoreUint32(d.size, capy)
	p.start(d, capy)
	if n := produce(t, d, p, 4096, pattern(0, capy)); n != capy {
		t.Fatalf("without a bound wrote %d, want %d", n, capy)
	}
	consume(t, d, q, capy, make([]byte, capy))
	atomic.StoreUint32(d.size, capy)
	if free, bad := p.space(d, 4096, 4096); free != 4096 || bad != "" || atomic.LoadUint32(d.size) != 4096 {
		t.Fatalf("bound 4 KiB: %d free (%q), ring_size %d", free, bad, atomic.LoadUint32(d.size))
	}
}

// A consumer that reads through the memfd (a peer of another user: Conn.readThrough) reads the
// bytes the producer wrote and zeros for those it only claimed (holes), and its reads allocate
// none of the holes' pages (SEEK_DATA finds none), where a read through the mapping would.
func TestRingReadThroughMemfdAllocatesNoHole(t *testing.T) {
	const capy = 1 << 20
	for _, through := range []bool{true, false} {
		r, err := newSegRes(Geometry{RingCapacity: capy})
		if err != nil {
			t.Fatal(err)
		}
		startRings(r.seg, r.lay)
		d := newDirection(r.seg, r.lay, headerSize)
		data := uint64(headerSize) + r.lay.dataOff // where the ring's data starts in the memfd
		if through {
			d.file, d.fileOff = r.memfd, data
		}
		p := &producer{}
		p.start(&d, capy)
		const wrote = 100
		produce(t, &d, p, capy, pattern(0, wrote))
		// A producer that claims a whole ring of bytes it never wrote after them.
		atomic.StoreUint32(d.size, capy)
		atomic.StoreUint64(d.head, capy)
		got := make([]byte, capy)
		q := &consumer{size: minRingSize}
		if n := consume(t, &d, q, capy, got); n != capy {
			t.Fatalf("read %d of %d bytes", n, capy)
		}
		if !bytes.Equal(got[:wrote], pattern(0, wrote)) || !bytes.Equal(got[wrote:], make([]byte, capy-wrote)) {
			t.Fatalf("through=%v: not the bytes written, then zeros", through)
		}
		// The pages of the data region past the one the producer wrote in.
		page := uint64(unix.Getpagesize())
		from, to := (data+wrote+page-1)/page*page, (data+capy)/page*page
		at, err := unix.Seek(r.memfd, int64(from), unix.SEEK_DATA)
		allocated := err == nil && uint64(at) < to
		r.close()
		if through && allocated {
			t.Fatalf("reading through the memfd allocated the hole's page at %d", at)
		}
		if !through && !allocated {
			t.Fatalf("reading through the mapping allocated no page (seek: %d, %v): the check sees nothing", at, err)
		}
	}
}
