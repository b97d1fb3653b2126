package colo

// Short-lived CARRIER connections stay on plain TCP.
//
// A CARRIER connection (a server of another user, spec/WIRE.md section 3) costs its set-up on
// top of a whole TCP handshake: the rendezvous, a fresh segment created, passed, mapped and
// unmapped by both sides, the server's sender check. A connection that moves a few bytes and
// closes gains less than that and is several times slower than over TCP. So a client watches how
// its CARRIER connections to each destination end, as the shim's clients do: when most of the
// recent ones were short, it dials that destination over plain TCP for a while, then offers a
// segment to one connection (the probe: the load may have changed) and decides by how that one
// ends. Long-lived connections dialed outside those plain periods are never affected, and DIRECT
// connections (no TCP handshake, cheaper than TCP's) are not watched: only a destination whose
// CARRIER connections were short has plain periods.
// COLO_SHORT_LIVED=accelerate turns this off, as for the shim.

import (
	"math/bits"
	"net/netip"
	"os"
	"sync"
	"time"
)

const (
	// A connection that moved less than shortBytes of stream (both directions together), used
	// no message, and lived less than shortLife or less than shortSetupTimes its own set-up
	// (the wait for the server's answer) was short: its segment did not pay for itself.
	shortLife       = 50 * time.Millisecond
	shortSetupTimes = 10
	shortBytes      = 64 << 10
	// Of the last shortWindow (at least shortRun) connections to one destination, three in
	// four short send the next ones there over plain TCP for plainFor; then one connection (the
	// probe) is offered a segment: a short probe starts another such period, a long one (or one
	// still open after shortLife) ends them.
	shortRun    = 8
	shortWindow = 16
	// Destinations remembered (a bound on memory: the table starts over when full).
	shortMaxDests = 4096
)

// plainFor is how long a plain period lasts (a variable: tests shorten it).
var plainFor = time.Second

// shortLivedOn is false with COLO_SHORT_LIVED=accelerate in the environment (a variable: tests
// set it).
var shortLivedOn = os.Getenv("COLO_SHORT_LIVED") != "accelerate"

// shortDest is what this process has seen of one destination's CARRIER connections.
type shortDest struct {
	recent     uint16    // how the last ones ended, newest in bit 0 (1: short)
	seen       uint32    // how many of them recent holds (up to shortWindow)
	plainUntil time.Time // zero: not in a plain period
	probeSince time.Time // when the probe after a plain period was dialed (zero: none)
}

var shortDests struct {
	sync.Mutex
	m map[netip.AddrPort]*shortDest
}

// shortPlain reports whether a connection to ap dialed now goes plain TCP. A connection it lets
// through after a plain period is the probe: it is recorded as such.
func shortPlain(ap netip.AddrPort, now time.Time) bool {
	if !shortLivedOn {
		return false
	}
	shortDests.Lock()
	defer shortDests.Unlock()
	d := shortDests.m[ap]
	if d == nil {
		return false
	}
	if !d.probeSince.IsZero() {
		if now.Sub(d.probeSince) < shortLife {
			return true // the probe may still end short: wait for its verdict
		}
		*d = shortDest{} // the probe is not short
		return false
	}
	switch {
	case d.plainUntil.IsZero():
		return false
	case now.Before(d.plainUntil):
		return true
	default:
		d.probeSince = now
		return false
	}
}

// wasShort reports whether a CARRIER connection that lived for lived after a set-up of setup,
// moved moved bytes of stream and used the message pool or not did not pay for its segment. One
// that used the pool (Loan, Send, Recv: bytes the stream counters do not see) is never short: a
// plain TCP connection has no pool, and its messages would fail there with ErrNoPool.
func wasShort(lived, setup time.Duration, moved uint64, messages bool) bool {
	quick := lived < shortLife || lived < shortSetupTimes*setup
	return quick && moved < shortBytes && !messages
}

// shortEnded records that a CARRIER connection to ap ended now, short or not (wasShort).
func shortEnded(ap netip.AddrPort, now time.Time, short bool) {
	if !shortLivedOn {
		return
	}
	shortDests.Lock()
	defer shortDests.Unlock()
	d := shortDests.m[ap]
	if d == nil {
		// A new destination: the table starts over when full.
		if shortDests.m == nil || len(shortDests.m) >= shortMaxDests {
			shortDests.m = map[netip.AddrPort]*shortDest{}
		}
		d = &shortDest{}
		shortDests.m[ap] = d
	}
	if !d.probeSince.IsZero() {
		// The verdict on the probe (or on an older connection ending meanwhile: as good).
		d.probeSince = time.Time{}
		if short {
			d.plainUntil = now.Add(plainFor)
		} else {
			*d = shortDest{}
		}
		return
	}
	d.recent = d.recent<<1 | b2u16(short)
	d.seen = min(d.seen+1, shortWindow)
	window := uint16(1)<<d.seen - 1
	if d.seen >= shortWindow {
		window = ^uint16(0)
	}
	shorts := uint32(bits.OnesCount16(d.recent & window))
	if d.seen >= shortRun && shorts*4 >= d.seen*3 && d.plainUntil.IsZero() {
		d.plainUntil = now.Add(plainFor)
		logf("connections to %v are short-lived: plain TCP for %v", ap, plainFor)
	}
}

func b2u16(b bool) uint16 {
	if b {
		return 1
	}
	return 0
}
