package colo

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
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

// longHold is how long a connection that must not count as short stays open: past shortLife,
// and past shortSetupTimes its set-up unless that took over 20 ms (a loaded host).
const longHold = 200 * time.Millisecond

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
	// A plain period longer than the rounds after the first shortRun take, even on a loaded
	// host (rounds of 50 ms: a shorter period let a probe through among them).
	shortRule(t, true, 3*time.Second)
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
	if tr := shortRound(t, l, d, longHold); tr != TransportColo {
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
		{"long-lived CARRIER", true, &Dialer{forceCarrier: true, watchShort: true}, longHold},
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
// left them: only connect may reuse such a port) fails cheaply and goes plain TCP. A run of them
// does not feed the short-lived rule: they were not short connections, and a plain period would
// keep the next long-lived ones off shared memory once ports are free. Run in a network
// namespace of its own, whose port range is 32 ports.
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
			if shortPlain(ap, time.Now()) {
				return fmt.Errorf("after %d dials that found no port to offer from, the destination is in a plain period (a port problem taken for short connections)", shortRun+2)
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

// CARRIER connections that move their data as messages (the pool: Loan, Send, Recv; no stream
// byte) are not short, however quickly they end: a plain TCP connection has no pool, and Loan
// would fail there with ErrNoPool.
func TestShortLivedCountsMessages(t *testing.T) {
	watchdog(t, 60*time.Second)
	shortRule(t, true, 5*time.Second)
	l := listen(t)
	d := &Dialer{forceCarrier: true, watchShort: true}
	const size = 64 << 10
	for i := range shortRun + 4 {
		c, s := pair(t, l, d)
		if c.Transport() != TransportColo {
			t.Fatalf("connection %d went %v (message traffic counted as short)", i, c.Transport())
		}
		done := make(chan error, 1)
		go func() {
			defer s.Close()
			for range 10 {
				m, err := s.Recv()
				if err != nil {
					done <- err
					return
				}
				if len(m.Data) != size || m.Data[size-1] != byte(i) {
					done <- fmt.Errorf("message of %d bytes", len(m.Data))
					return
				}
				m.Release()
			}
			done <- nil
		}()
		for range 10 {
			m, err := c.Loan(size)
			if err != nil {
				t.Fatalf("connection %d: loan: %v", i, err)
			}
			m.Data[size-1] = byte(i)
			if err := c.Send(m); err != nil {
				t.Fatalf("connection %d: send: %v", i, err)
			}
		}
		if err := <-done; err != nil {
			t.Fatalf("connection %d: server: %v", i, err)
		}
		c.Close()
	}
}

// A client closes its carrier with a reset (spec/WIRE.md section 3, step 4): a FIN close left
// its bound odd port in TIME_WAIT for a minute, where no later carrier can bind it.
func TestCarrierClosesWithoutTimeWait(t *testing.T) {
	watchdog(t, 60*time.Second)
	shortRule(t, false, plainFor)
	l := listen(t)
	lport := uint16(netip.MustParseAddrPort(l.Addr().String()).Port())
	d := &Dialer{forceCarrier: true}
	ports := map[uint16]bool{}
	for range 40 {
		c, s := pair(t, l, d)
		if c.Transport() == TransportColo {
			ports[netip.MustParseAddrPort(c.LocalAddr().String()).Port()] = true
		}
		c.Close() // the client closes first, as in a connection per request
		s.Close()
	}
	if len(ports) < 20 {
		t.Fatalf("only %d of 40 connections were set up", len(ports))
	}
	time.Sleep(50 * time.Millisecond) // the server's FIN or the reset reaches the client's socket
	// This thread's namespace: /proc/net is the main thread's, which a test that entered a
	// namespace of its own on a locked thread may have left there (TestCarrierPortsInTimeWait).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tw := 0
	for _, f := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st ...: addresses as HEX_IP:HEX_PORT, st 06 is TIME_WAIT.
			fl := strings.Fields(line)
			if len(fl) < 4 || fl[3] != "06" {
				continue
			}
			lp, err1 := strconv.ParseUint(fl[1][strings.LastIndexByte(fl[1], ':')+1:], 16, 16)
			rp, err2 := strconv.ParseUint(fl[2][strings.LastIndexByte(fl[2], ':')+1:], 16, 16)
			if err1 == nil && err2 == nil && uint16(rp) == lport && ports[uint16(lp)] {
				tw++
			}
		}
	}
	if tw != 0 {
		t.Fatalf("%d of %d carrier ports left in TIME_WAIT", tw, len(ports))
	}
}

// forgetShortLived clears what was seen.
func forgetShortLived() {
	shortDests.Lock()
	shortDests.m = nil
	shortDests.Unlock()
}

// A connection counts as short by its life, its bytes, its messages and its set-up, as the
// shim's (rust/colo-preload/src/record/adapt.rs, Lived::short).
func TestWasShort(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		lived, setup time.Duration
		moved        uint64
		messages     bool
		short        bool
	}{
		{5 * ms, ms, 1100, false, true},
		{90 * ms, ms, 1100, false, false},
		{90 * ms, 20 * ms, 1100, false, true}, // under ten times a slow set-up
		{300 * ms, 20 * ms, 1100, false, false},
		{5 * ms, ms, shortBytes, false, false},
		{5 * ms, ms, 0, true, false},
	} {
		if got := wasShort(tc.lived, tc.setup, tc.moved, tc.messages); got != tc.short {
			t.Errorf("wasShort(%v, %v, %d, %v) = %v", tc.lived, tc.setup, tc.moved, tc.messages, got)
		}
	}
}
