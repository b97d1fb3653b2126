package colo

import (
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// A producer that gave back the pages of its unread bytes (DROPPED, with RESET: orphan.go) may
// have left zeros where they were: a reader that had already seen them published hands on
// none of them, and reports the reset.
func TestDroppedBytesAreNeverRead(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	c, s := pair(t, l, nil)
	defer c.Close()
	defer s.Close()
	if _, err := s.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if n, err := c.Read(b); n != 1 || err != nil {
		t.Fatalf("first read: %d %v", n, err)
	}
	// The reader knows of two more bytes (its cached head); the producer drops them now.
	atomic.OrUint32(s.out.flags, flagRESET|flagDropped)
	n, err := c.Read(b)
	if n != 0 || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after DROPPED: %d %q %v, want 0 and ECONNRESET", n, b[:n], err)
	}
}
