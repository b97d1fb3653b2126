package colo

import (
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A peer that sleeps on the futex at its waiting word (spec section 6, FUTEX bit, as the Rust
// implementation does for short sleeps) is woken by our progress and by our close.
func TestFutexWaker(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	for _, how := range []string{"write", "close"} {
		c, s := pair(t, l, nil)
		w := c.myWaiting // the client's word: the server must wake it
		atomic.OrUint32(w, waitFutex)
		woke := make(chan unix.Errno, 1)
		go func() {
			ts := unix.Timespec{Sec: 10}
			_, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), 0 /* FUTEX_WAIT, shared */, waitFutex,
				uintptr(unsafe.Pointer(&ts)), 0, 0)
			woke <- e
		}()
		time.Sleep(50 * time.Millisecond)
		start := time.Now()
		if how == "write" {
			s.Write([]byte("x"))
		} else {
			s.Close()
		}
		if e := <-woke; e == unix.ETIMEDOUT || time.Since(start) > 5*time.Second {
			t.Fatalf("%s: futex sleeper not woken (%v)", how, e)
		}
		c.Close()
		s.Close()
	}
}
