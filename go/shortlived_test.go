package colo

import (
	"bytes"
	"io"
	"testing"
	"time"
)

// shortRound dials l with d, echoes 64 B through the server side, keeps the connection open for
// hold, closes both ends and returns the client's transport.
func shortRound(t *testing.T, l *Listener, d *Dialer, hold time.Duration) Transport {
	t.Helper()
	c, s := pair(t, l, d)
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(s, s)
		done <- err
		s.Close()
	}()
	req := pattern(7, 64)
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 64)
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, req) {
		t.Fatalf("echo: %v, equal %v", err, bytes.Equal(got, req))
	}
	time.Sleep(hold)
	tr := c.Transport()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("server's copy: %v", err)
	}
	return tr
}

// shortRule sets the rule up for a test: on, a fresh table, plain periods of period.
func shortRule(t *testing.T, on bool, period time.Duration) {
	oldOn, oldFor := shortLivedOn, plainFor
	shortLivedOn, plainFor = on, period
	forgetShortLived()
	t.Cleanup(func() {
		shortLivedOn, plainFor = oldOn, oldFor
		forgetShortLived()
	})
}

// A run of one-request CARRIER connections to a destination sends the next ones there over plain
// TCP (the set-up costs more than it saves); after the plain period a long-lived probe brings
// segments back.
func TestShortLivedCarrierGoesPlain(t *testing.T) {
	watchdog(t, 60*time.Second)
	shortRule(t, true, 400*time.Millisecond)
	l := listen(t)
	d := &Dialer{forceCarrier: true, watchShort: true}
	var trs []Transport
	for range 2 * shortWindow {
		trs = append(trs, shortRound(t, l, d, 0))
	}
	plain := 0
	for _, tr := range trs {
		if tr == TransportTCP {
			plain++
		}
	}
	// At least shortRun go through the set-up; under load a few may outlive shortLife, which
	// three in four tolerate.
	if trs[len(trs)-1] != TransportTCP || plain < shortWindow {
		t.Fatalf("transports of %d one-request CARRIER connections: %v (%d plain TCP)", len(trs), trs, plain)
	}
	t.Logf("transports: %v", trs)
	// The plain period ends: the next connection is the probe; a long one ends the rule.
	time.Sleep(plainFor + 50*time.Millisecond)
	if tr := shortRound(t, l, d, 2*shortLife); tr != TransportColo {
		t.Fatalf("the probe after the plain period: %v", tr)
	}
	if tr := shortRound(t, l, d, 0); tr != TransportColo {
		t.Fatalf("after a long-lived probe: %v", tr)
	}
}

// Long-lived CARRIER connections, DIRECT ones, and CARRIER ones with the rule off
// (COLO_SHORT_LIVED=accelerate) stay on shared memory.
func TestShortLivedRuleSparesOthers(t *testing.T) {
	watchdog(t, 60*time.Second)
	l := listen(t)
	for _, tc := range []struct {
		name string
		on   bool
		d    *Dialer
		hold time.Duration
	}{
		{"long-lived CARRIER", true, &Dialer{forceCarrier: true, watchShort: true}, 2 * shortLife},
		{"one-request DIRECT", true, &Dialer{}, 0},
		{"one-request CARRIER, rule off", false, &Dialer{forceCarrier: true, watchShort: true}, 0},
	} {
		shortRule(t, tc.on, time.Minute)
		for i := range shortWindow + 4 {
			if tr := shortRound(t, l, tc.d, tc.hold); tr != TransportColo {
				t.Fatalf("%s: connection %d went %v", tc.name, i, tr)
			}
		}
	}
}
