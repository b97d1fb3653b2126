package colo

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// A CARRIER dial that finds every odd port of the range in TIME_WAIT (a run of plain connections
// left them: only connect may reuse such a port) fails cheaply and goes plain TCP, and a run of
// them is short-lived: no set-up is tried for a while. Run in a network namespace of its own,
// whose port range is 32 ports.
func TestCarrierPortsInTimeWait(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (a network namespace)")
	}
	watchdog(t, 60*time.Second)
	shortRule(t, true, time.Minute)
	errc := make(chan error, 1)
	go func() {
		// The thread stays in the namespace and ends with the goroutine (never unlocked).
		runtime.LockOSThread()
		errc <- func() error {
			if err := enterNetns(40000, 40031); err != nil {
				return err
			}
			ports.once = sync.Once{} // read this namespace's range
			defer func() { ports.once = sync.Once{} }()
			l, err := ListenColo("tcp", "127.0.0.1:50000") // outside the range
			if err != nil {
				return err
			}
			defer l.Close()
			ap := netip.MustParseAddrPort(l.Addr().String())
			for p := 40001; p <= 40031; p += 2 {
				nd := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p}}
				c, err := nd.Dial("tcp", ap.String())
				if err != nil {
					return fmt.Errorf("plain dial from port %d: %v", p, err)
				}
				s, err := l.AcceptColo()
				if err != nil {
					return err
				}
				c.Close() // the client closes first: its port stays in TIME_WAIT
				io.Copy(io.Discard, s)
				s.Close()
			}
			d := &Dialer{forceCarrier: true, watchShort: true}
			for i := range shortRun + 2 {
				c, err := d.Dial("tcp", ap.String())
				if err != nil {
					return fmt.Errorf("dial %d: %v", i, err)
				}
				s, err := l.AcceptColo()
				if err != nil {
					return err
				}
				if c.Transport() != TransportTCP || s.Transport() != TransportTCP {
					return fmt.Errorf("dial %d with every odd port in TIME_WAIT: %v/%v", i, c.Transport(), s.Transport())
				}
				if _, err := c.Write([]byte("plain")); err != nil {
					return err
				}
				b := make([]byte, 5)
				if _, err := io.ReadFull(s, b); err != nil || string(b) != "plain" {
					return fmt.Errorf("dial %d: read %q, %v", i, b, err)
				}
				c.Close()
				s.Close()
			}
			if !shortPlain(ap, time.Now()) {
				return fmt.Errorf("after %d dials that found no port to offer from, the destination is not in a plain period", shortRun+2)
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// enterNetns moves the calling (locked) thread into a new network namespace with its loopback
// up and the ephemeral port range lo..hi.
func enterNetns(lo, hi int) error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare: %v", err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_UP | unix.IFF_LOOPBACK | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %v", err)
	}
	return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte(fmt.Sprintf("%d %d", lo, hi)), 0)
}
