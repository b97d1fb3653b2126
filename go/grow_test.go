package colo

// Connections whose rings grow on demand and shrink when idle (spec/WIRE.md section 5, "Growing
// and shrinking").

import (
	"bytes"
	"errors"
	"io"
	"os"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// echoServer echoes every byte s reads back, then shuts its writing side down.
func echoServer(s *Conn) chan error {
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(s, s)
		if err == nil {
			err = s.CloseWrite()
		}
		done <- err
	}()
	return done
}

// writeBeforeRead writes n bytes of the pattern to an echo server before reading anything, then
// reads the echo back and checks it.
func writeBeforeRead(t *testing.T, c, s *Conn, n int) {
	t.Helper()
	done := echoServer(s)
	data := pattern(0, n)
	if w, err := c.Write(data); w != n || err != nil {
		t.Fatalf("write of %d bytes before reading: %d, %v", n, w, err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("echo: %d of %d bytes (%v), equal %v", len(got), n, err, bytes.Equal(got, data))
	}
	if err := <-done; err != nil {
		t.Fatalf("echo server: %v", err)
	}
}

// A writer ahead of its reader is buffered as TCP would buffer it: the rings grow.
func TestWriteBeforeRead(t *testing.T) {
	watchdog(t, 60*time.Second)
	l := listen(t)
	for _, n := range []int{4 << 20, 8<<20 - 64<<10} {
		c, s := pair(t, l, nil)
		writeBeforeRead(t, c, s, n)
		c.Close()
		s.Close()
	}
}

// One goroutine writes to a connection whose other end it reads only afterwards: the ring takes
// it all, as a TCP socket's buffers would.
func TestOneGoroutineWritesThenReads(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	c, s := pair(t, l, nil)
	defer c.Close()
	defer s.Close()
	data := pattern(0, 100_000)
	if n, err := c.Write(data); n != len(data) || err != nil {
		t.Fatalf("write: %d, %v", n, err)
	}
	got := make([]byte, len(data))
	if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read: %v", err)
	}
}

// ringSize is the current size of one direction's ring of c's segment (0: client to server).
func ringSize(c *Conn, dir int) uint32 {
	return atomic.LoadUint32(u32at(c.seg, headerSize+uint64(dir)*c.lay.blockSize+dRingSize))
}

// residentPages counts the pages of c's segment that are in memory.
func residentPages(t *testing.T, c *Conn) int {
	t.Helper()
	vec := make([]byte, (len(c.seg)+os.Getpagesize()-1)/os.Getpagesize())
	_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&c.seg[0])), uintptr(len(c.seg)), uintptr(unsafe.Pointer(&vec[0])))
	if e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// After a transfer that grew both rings, a quiet connection gives the memory back: both rings are
// back to 4 KiB, and the segment holds only the header, each block's control page and each
// ring's first page.
func TestIdleRingsShrink(t *testing.T) {
	watchdog(t, 60*time.Second)
	l := listen(t)
	c, s := pair(t, l, nil)
	defer c.Close()
	defer s.Close()
	done := echoServer(s)
	const total = 32 << 20
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(pattern(0, total))
		werr <- err
	}()
	// A slow reader: the rings fill and grow.
	buf := make([]byte, 64<<10)
	for got := 0; got < total; {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("read after %d bytes: %v", got, err)
		}
		if !bytes.Equal(buf[:n], pattern(got, n)) {
			t.Fatalf("bytes %d..%d differ", got, got+n)
		}
		got += n
		if got%(4<<20) < n {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if ringSize(c, 0) <= minRingSize || ringSize(c, 1) <= minRingSize {
		t.Fatalf("the rings did not grow: %d and %d bytes", ringSize(c, 0), ringSize(c, 1))
	}
	for ringSize(c, 0) != minRingSize || ringSize(c, 1) != minRingSize {
		time.Sleep(100 * time.Millisecond) // the watchdog bounds the wait
	}
	// The header, and per direction its control page and the ring's first page. A shrinker
	// publishes the smaller size before it gives the pages back, so look again for a while.
	n := residentPages(t, c)
	for try := 0; n > 3 && try < 50; try++ {
		time.Sleep(100 * time.Millisecond)
		n = residentPages(t, c)
	}
	if n > 3 {
		t.Fatalf("%d pages of the segment resident after the rings shrank, want at most 3 (the header, and a page a direction)", n)
	}
	// The connection works as before, and grows again.
	writeBeforeRead2 := pattern(0, 1<<20)
	if n, err := c.Write(writeBeforeRead2); n != len(writeBeforeRead2) || err != nil {
		t.Fatalf("write after shrinking: %d, %v", n, err)
	}
	c.CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, writeBeforeRead2) {
		t.Fatalf("echo after shrinking: %d bytes, %v", len(got), err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Two sides that both write before they read both complete, as over TCP.
func TestBothWriteBeforeReading(t *testing.T) {
	watchdog(t, 60*time.Second)
	l := listen(t)
	c, s := pair(t, l, nil)
	defer c.Close()
	defer s.Close()
	const n = 2 << 20
	data := pattern(0, n)
	both := func(x *Conn, done chan error) {
		if w, err := x.Write(data); w != n || err != nil {
			done <- err
			return
		}
		got := make([]byte, n)
		_, err := io.ReadFull(x, got)
		if err == nil && !bytes.Equal(got, data) {
			err = errors.New("bytes differ")
		}
		done <- err
	}
	dc, ds := make(chan error, 1), make(chan error, 1)
	go both(c, dc)
	go both(s, ds)
	if err := <-dc; err != nil {
		t.Fatalf("client: %v", err)
	}
	if err := <-ds; err != nil {
		t.Fatalf("server: %v", err)
	}
}

// SetWriteBuffer bounds how far the outgoing ring grows.
func TestSetWriteBufferBoundsGrowth(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	c, s := pair(t, l, nil)
	defer c.Close()
	defer s.Close()
	if err := c.SetWriteBuffer(10000); err != nil {
		t.Fatal(err)
	}
	// The server reads nothing: the write fills what the bound allows, then times out.
	c.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
	n, err := c.Write(make([]byte, 1<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) || n != 16384 || ringSize(c, 0) != 16384 {
		t.Fatalf("wrote %d (%v), ring of %d bytes: want 16384 in a ring of 16384", n, err, ringSize(c, 0))
	}
}

// A peer that scribbles over ring_size resets the connection (EPROTO).
func TestScribbledRingSizeIsProtocolError(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	c, s := pair(t, l, nil)
	defer c.Close()
	defer s.Close()
	atomic.StoreUint32(u32at(c.seg, headerSize+dRingSize), 3000)
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("read after ring_size was scribbled over: %v, want EPROTO", err)
	}
}

// As the Rust growth.rs eight_mebibytes test: 4 MiB rings, a client that writes all before
// reading, and an echo server that echoes 1 MiB, pauses 200 ms (the client fills C2S), then
// echoes on: S2C fills while C2S is between its space_wake mark and full, and the server's
// blocked write must release the client's (spec section 6, "Waiting for space").
func TestWriteBeforeReadThroughAPausingEcho(t *testing.T) {
	watchdog(t, 20*time.Second)
	l := listen(t)
	n := 8<<20 - 64<<10
	c, s := pair(t, l, &Dialer{Geometry: Geometry{RingCapacity: 4 << 20, SlotSize: 64 << 10, SlotCount: 16}})
	done := make(chan error, 1)
	go func() {
		b := make([]byte, 32<<10)
		total := 0
		for {
			k, err := s.Read(b)
			if err == io.EOF {
				done <- s.CloseWrite()
				return
			}
			if err != nil {
				done <- err
				return
			}
			if _, err := s.Write(b[:k]); err != nil {
				done <- err
				return
			}
			total += k
			if total%(1<<20) == 0 && total < 4<<20 {
				time.Sleep(200 * time.Millisecond)
			}
		}
	}()
	data := pattern(0, n)
	if w, err := c.Write(data); w != n || err != nil {
		t.Fatalf("write: %d, %v", w, err)
	}
	c.CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("echo: %d of %d (%v)", len(got), n, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
