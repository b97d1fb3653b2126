package colo

import (
	"bytes"
	"io"
	"testing"
	"time"
	"unsafe"
)

// nonZeroPages counts the memory pages b lies on that hold a byte other than zero there.
func nonZeroPages(b []byte) int {
	n := 0
	start := uintptr(unsafe.Pointer(&b[0]))
	for at := 0; at < len(b); {
		end := min(int((start+uintptr(at)+pageSize)&^(pageSize-1)-start), len(b))
		if bytes.IndexFunc(b[at:end], func(r rune) bool { return r != 0 }) >= 0 {
			n++
		}
		at = end
	}
	return n
}

// A side that closes gives back the pages of the ring it wrote but those of bytes its peer has
// yet to read (Conn.outgoingFree): the peer keeps the memfd, and every page left there stays
// charged to the writer. The bytes still unread are delivered after the close all the same.
func TestCloseGivesBackTheWrittenRing(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	c, s := pair(t, l, nil)
	defer c.Close()
	read := bytes.Repeat([]byte{0xab}, 512<<10)
	go s.Write(read)
	got := make([]byte, len(read))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, read) {
		t.Fatalf("read %v", err)
	}
	unread := bytes.Repeat([]byte{0xcd}, 100)
	if _, err := s.Write(unread); err != nil {
		t.Fatal(err)
	}
	ring := c.in.data[:c.lay.RingCapacity]
	if n := nonZeroPages(ring); n < 8 {
		t.Fatalf("the server wrote %d pages of the ring before its close", n)
	}
	s.parkTable = nil // not parked for a later connection of this pair: let go of
	s.Close()
	// Given back off the closing goroutine (unmapAfter): looked at until it is done. What stays:
	// the pages of the unread bytes (two at most) and the data's first page, which holds the
	// direction's words too.
	for nonZeroPages(ring) > 3 {
		time.Sleep(10 * time.Millisecond)
	}
	got = make([]byte, 200)
	n, err := io.ReadFull(c, got)
	if n != len(unread) || err != io.ErrUnexpectedEOF || !bytes.Equal(got[:n], unread) {
		t.Fatalf("after the close: read %d bytes (%v), want the %d unread ones then EOF", n, err, len(unread))
	}
}
