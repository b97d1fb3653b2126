package colo

import (
	"testing"
	"time"
)

func TestSpinPolicy(t *testing.T) {
	defer func(f func() bool) { cpusCrowded = f }(cpusCrowded)
	cpusCrowded = func() bool { return false } // whatever else this host runs meanwhile
	var s spinner
	never := func() bool { return false }
	always := func() bool { return true }
	s.ns.Store(int64(2 * time.Microsecond))
	if !s.try(always, never) {
		t.Fatal("ready condition not seen")
	}
	for i := 0; i < 8; i++ {
		if s.try(never, never) {
			t.Fatal("spin succeeded on a false condition")
		}
	}
	// Stopped: 15 of 16 waits do not spin at all (they return at once, ready or not).
	spun := 0
	for i := 0; i < 32; i++ {
		if s.try(always, never) {
			spun++
			break
		}
	}
	if spun != 1 || s.fails.Load() != 0 {
		t.Fatalf("a probe should succeed and restart spinning (spun %d, fails %d)", spun, s.fails.Load())
	}
	// A spin ended by a deadline or Close is no success.
	for i := 0; i < 8; i++ {
		s.try(never, never)
	}
	f := s.fails.Load()
	for i := 0; i < 16; i++ {
		s.try(always, always)
	}
	if s.fails.Load() < f {
		t.Fatal("an interrupted spin counted as a success")
	}
	// 0 never spins.
	s.ns.Store(0)
	if s.try(always, never) {
		t.Fatal("spun with a zero budget")
	}
}

func TestNoSpinOnACrowdedHost(t *testing.T) {
	defer func(f func() bool) { cpusCrowded = f }(cpusCrowded)
	cpusCrowded = func() bool { return true }
	var s spinner
	s.ns.Store(int64(time.Millisecond))
	if s.try(func() bool { return true }, func() bool { return false }) {
		t.Fatal("an adaptive spin ran although threads wait for a CPU")
	}
	s.ns.Store(-1) // busy polling was asked for: it spins anyway
	if !s.try(func() bool { return true }, func() bool { return false }) {
		t.Fatal("busy polling did not spin")
	}
	if n, ok := runningOfLoadavg([]byte("0.52 0.58 0.59 3/467 1234\n")); !ok || n != 3 {
		t.Fatalf("running count %d %v", n, ok)
	}
	if _, ok := runningOfLoadavg([]byte("garbage")); ok {
		t.Fatal("garbage parsed")
	}
	if n, ok := sampleRunning(); !ok || n < 1 {
		t.Fatalf("this host's /proc/loadavg: running %d, %v", n, ok)
	}
	if onlineCPUs() < 1 {
		t.Fatal("no CPU online")
	}
}
