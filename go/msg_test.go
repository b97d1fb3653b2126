package colo

import (
	"errors"
	"io"
	"syscall"
	"testing"
	"time"
)

func TestMessages(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	g := Geometry{RingCapacity: 4096, SlotSize: 192, SlotCount: 3}
	c, s := pair(t, l, &Dialer{Geometry: g})
	defer c.Close()
	if s.Geometry() != g || s.SlotSize() != 192 {
		t.Fatalf("server geometry %+v", s.Geometry())
	}
	// Echo server: receive a view, loan, copy, send, release.
	go func() {
		defer s.Close()
		for {
			m, err := s.Recv()
			if err != nil {
				return
			}
			out, err := s.Loan(len(m.Data))
			if err != nil {
				return
			}
			copy(out.Data, m.Data)
			if err := s.Send(out); err != nil {
				return
			}
			m.Release()
		}
	}()
	const count = 2000
	for k := 0; k < count; k++ {
		size := k % 193
		m, err := c.Loan(size)
		if err != nil {
			t.Fatal(err)
		}
		for j := range m.Data {
			m.Data[j] = byte((k + j) % 251)
		}
		if err := c.Send(m); err != nil {
			t.Fatal(err)
		}
		r, err := c.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Data) != size {
			t.Fatalf("message %d: %d bytes, want %d", k, len(r.Data), size)
		}
		for j, b := range r.Data {
			if b != byte((k+j)%251) {
				t.Fatalf("message %d byte %d: %d", k, j, b)
			}
		}
		if err := r.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Loan(193); !errors.Is(err, syscall.EMSGSIZE) {
		t.Fatalf("oversized loan: %v", err)
	}
	// All three slots loaned: a fourth loan waits until the write deadline.
	var ms []*Message
	for i := 0; i < 3; i++ {
		m, err := c.Loan(1)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	c.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := c.Loan(1); !errors.Is(err, syscall.ETIMEDOUT) && !isTimeout(err) {
		t.Fatalf("loan with no free slot: %v", err)
	}
	c.SetWriteDeadline(time.Time{})
	for _, m := range ms {
		m.Release() // unsent loans go back to the free list
	}
	if m, err := c.Loan(1); err != nil {
		t.Fatal(err)
	} else {
		m.Release()
	}
	c.CloseWrite()
	if _, err := c.Recv(); err != io.EOF {
		t.Fatalf("recv after close: %v", err)
	}
	// Messages on a connection without a pool.
	c2, s2 := pair(t, l, &Dialer{Geometry: Geometry{RingCapacity: 4096}})
	defer c2.Close()
	defer s2.Close()
	if _, err := c2.Loan(1); !errors.Is(err, syscall.ENOBUFS) {
		t.Fatalf("loan without pool: %v", err)
	}
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// Concurrent producers and an asynchronous releaser must not deadlock: a Loan waiting for a slot
// must not block a Send, and a Recv waiting for a message must not block a Release.
func TestMessagesConcurrent(t *testing.T) {
	watchdog(t, 60*time.Second)
	l := listen(t)
	c, s := pair(t, l, &Dialer{Geometry: Geometry{RingCapacity: 4096, SlotSize: 64, SlotCount: 4}})
	defer c.Close()
	defer s.Close()
	const producers, each = 4, 500
	done := make(chan error, producers)
	for p := 0; p < producers; p++ {
		go func() {
			for i := 0; i < each; i++ {
				m, err := c.Loan(8)
				if err != nil {
					done <- err
					return
				}
				if err := c.Send(m); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	release := make(chan *Message, producers*each)
	released := make(chan struct{})
	go func() {
		defer close(released)
		for m := range release {
			if err := m.Release(); err != nil {
				t.Error(err)
			}
		}
	}()
	for i := 0; i < producers*each; i++ {
		m, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		release <- m
	}
	close(release)
	for p := 0; p < producers; p++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	<-released
}

// A pool's bitset keeps each slot's bit apart across words and chunks, and makes only the
// chunks of the slots set.
func TestBitsetChunks(t *testing.T) {
	b := newBitset(65536)
	slots := []uint32{0, 63, 64, 4095, 4096, 65535}
	for _, s := range slots {
		b.set(s)
	}
	made := 0
	for _, c := range b {
		if c != nil {
			made++
		}
	}
	if made != 3 {
		t.Fatalf("%d chunks made for slots %v, want 3", made, slots)
	}
	for s := uint32(0); s < 65536; s++ {
		want := false
		for _, x := range slots {
			want = want || x == s
		}
		if b.has(s) != want {
			t.Fatalf("slot %d: has %v, want %v", s, b.has(s), want)
		}
	}
	for _, s := range slots {
		b.clear(s)
		if b.has(s) {
			t.Fatalf("slot %d still set after clear", s)
		}
	}
	b.clear(20000) // in a chunk never made: nothing to do
}
