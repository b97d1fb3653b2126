package colo

// How long a side spins before it sleeps (spec/WIRE.md section 9), as
// rust/colo-ring/src/spin.rs has it.

import (
	"os"
	"runtime"
	"sync/atomic"
	"time"
)

// spinner is the local spin policy of spec section 9.
// Its fields are atomic only so that a reader and a writer goroutine may share them; they order
// no other memory (a stale value only changes how long one wait spins).
type spinner struct {
	ns    atomic.Int64  // <0: spin only; 0: never spin
	fails atomic.Int32  // spins in a row that ended in sleep
	skips atomic.Uint32 // waits since fails reached 8 (one in 16 spins)
}

// defaultSpinNs is COLO_SPIN_US in nanoseconds (-1: spin only), 5000 when unset or malformed.

var defaultSpinNs = func() int64 {
	v := os.Getenv("COLO_SPIN_US")
	switch v {
	case "":
		return 5000
	case "inf", "-1":
		return -1
	}
	var us int64
	for _, ch := range v {
		if ch < '0' || ch > '9' {
			return 5000
		}
		us = us*10 + int64(ch-'0')
	}
	return us * 1000
}()

// try spins until ready() or the spin budget is spent; it reports whether ready() held.
// Adaptive (spec section 9): after 8 spins in a row that ended in sleep, a side spins only once
// in 16 waits, for 4 times the budget, until a spin succeeds again. The longer probe lets two
// sides that both sleep (a ping-pong in which every answer takes a wake-up, longer than the
// budget) discover that spinning pays: the prober catches the sleeper's answer, spins again, and
// the other side's next probe then succeeds at once.
func (s *spinner) try(ready func() bool, interrupted func() bool) bool {
	ns := s.ns.Load()
	if ns == 0 {
		return false
	}
	if ns > 0 && cpusCrowded() {
		return false // threads wait for a CPU: spinning would hold off the one we wait for
	}
	budget := ns
	if ns > 0 && s.fails.Load() >= 8 {
		if s.skips.Add(1)%16 != 0 {
			return false
		}
		budget = 4 * ns
	}
	start := nanotime()
	yielded := start
	for i := 1; ; i++ {
		if ready() {
			if !interrupted() { // a deadline or Close is no evidence that spinning pays
				s.fails.Store(0)
			}
			return true
		}
		if i%16 == 0 {
			now := nanotime()
			if budget > 0 && now-start > budget {
				if s.fails.Load() < 1000 {
					s.fails.Add(1)
				}
				return false
			}
			// Let other goroutines of this process run: a spin must not delay the work
			// that would make our condition true (in-process peers, handlers). At most once
			// per spinYieldNs, not every 16 rounds: runtime.Gosched may wake an idle P's
			// thread (a futex system call, and a thread that competes with the peer's for a
			// CPU).
			if now-yielded >= spinYieldNs {
				runtime.Gosched()
				yielded = nanotime()
			}
		}
	}
}

// cpusCrowded is asked before every adaptive spin (a variable so that tests can fix the answer).
var cpusCrowded = cpusOversubscribed

// spinYieldNs is how long a spin runs between two yields to the goroutines of this process.
const spinYieldNs = 2000

var monoBase = time.Now()

// nanotime is monotonic nanoseconds since the package started.
func nanotime() int64 { return int64(time.Since(monoBase)) }

// SetSpin sets how long this side spins, re-checking the ring, before it sleeps on its doorbell
// (spec/WIRE.md section 9). 0 never spins; d > 0 spins up to d (adaptively: a side whose spins
// keep ending in sleep mostly stops spinning); d < 0 spins and never sleeps (busy polling, which
// costs a CPU while waiting). The default comes from COLO_SPIN_US ("inf" or -1 for busy polling),
// else 5us, or no spin when the two processes share a single CPU. No effect on TCP connections.
func (c *Conn) SetSpin(d time.Duration) {
	if c.tcp != nil {
		return
	}
	if d < 0 {
		d = -1
	}
	c.spin.fails.Store(0)
	c.spin.ns.Store(int64(d))
}
