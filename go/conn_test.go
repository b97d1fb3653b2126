package colo

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/nettest"
)

// watchdog fails the test binary if a test hangs.
func watchdog(t *testing.T, d time.Duration) {
	t.Helper()
	tm := time.AfterFunc(d, func() {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		os.Stderr.Write(buf[:n])
		panic("watchdog: " + t.Name() + " took longer than " + d.String())
	})
	t.Cleanup(func() { tm.Stop() })
}

func listen(t *testing.T) *Listener {
	t.Helper()
	l, err := ListenColo("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if !l.Colo() {
		t.Fatal("listener has no rendezvous")
	}
	return l
}

// pair returns a connected (client, server) pair.
func pair(t testing.TB, l *Listener, d *Dialer) (*Conn, *Conn) {
	if d == nil {
		d = &Dialer{}
	}
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := l.AcceptColo()
		ch <- res{c, err}
	}()
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return c, r.c
}

func TestEchoColo(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	c, s := pair(t, l, nil)
	defer c.Close()
	defer s.Close()
	if c.Transport() != TransportColo || s.Transport() != TransportColo {
		t.Fatalf("transport %v/%v", c.Transport(), s.Transport())
	}
	if _, ok := c.RemoteAddr().(*net.TCPAddr); !ok {
		t.Fatalf("remote addr %T", c.RemoteAddr())
	}
	if c.RemoteAddr().String() != l.Addr().String() {
		t.Errorf("client remote %v, listener %v", c.RemoteAddr(), l.Addr())
	}
	go func() {
		io.Copy(s, s)
		s.CloseWrite()
	}()
	// Larger than the ring, in odd sizes, checked byte for byte.
	const total = 5<<20 + 123
	src := make([]byte, total)
	for i := range src {
		src[i] = byte(i % 251)
	}
	errc := make(chan error, 1)
	go func() {
		for off := 0; off < total; {
			n := min(total-off, 1+off%70000)
			if _, err := c.Write(src[off : off+n]); err != nil {
				errc <- err
				return
			}
			off += n
		}
		errc <- c.CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatalf("echo mismatch: got %d bytes", len(got))
	}
}

func TestFallbackTCP(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	// A plain TCP client reaches the colo listener.
	go func() {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			return
		}
		c.Write([]byte("plain"))
		c.Close()
	}()
	s, err := l.AcceptColo()
	if err != nil {
		t.Fatal(err)
	}
	if s.Transport() != TransportTCP {
		t.Fatalf("transport %v", s.Transport())
	}
	b, _ := io.ReadAll(s)
	s.Close()
	if string(b) != "plain" {
		t.Fatalf("got %q", b)
	}
	// A colo client dialing a plain TCP server gets TCP.
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	go func() {
		c, err := tl.Accept()
		if err == nil {
			c.Write([]byte("tcp"))
			c.Close()
		}
	}()
	c, err := Dial("tcp", tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if c.Transport() != TransportTCP {
		t.Fatalf("transport %v", c.Transport())
	}
	b, _ = io.ReadAll(c)
	c.Close()
	if string(b) != "tcp" {
		t.Fatalf("got %q", b)
	}
	// TCPOnly dialer.
	go func() {
		s, err := l.AcceptColo()
		if err == nil {
			s.Close()
		}
	}()
	c, err = (&Dialer{TCPOnly: true}).Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if c.Transport() != TransportTCP {
		t.Fatal("TCPOnly gave colo")
	}
	c.Close()
	// Connection refused is reported as such.
	port := tl.Addr().(*net.TCPAddr).Port
	tl.Close()
	if _, err := Dial("tcp", "127.0.0.1:"+strconv.Itoa(port)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial closed port: %v", err)
	}
}

func TestNettestColo(t *testing.T) {
	watchdog(t, 120*time.Second)
	l := listen(t)
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		c, s := pair(t, l, nil)
		return c, s, func() { c.Close(); s.Close() }, nil
	})
}

func TestNettestTCPFallback(t *testing.T) {
	watchdog(t, 120*time.Second)
	l := listen(t)
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		c, s := pair(t, l, &Dialer{TCPOnly: true})
		if c.Transport() != TransportTCP || s.Transport() != TransportTCP {
			t.Fatal("expected TCP")
		}
		return c, s, func() { c.Close(); s.Close() }, nil
	})
}

func TestHalfCloseAndErrors(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	c, s := pair(t, l, nil)
	defer c.Close()
	// CloseWrite: the peer reads the bytes, then EOF; the reverse direction still works.
	c.Write([]byte("hello"))
	c.CloseWrite()
	b, err := io.ReadAll(s)
	if err != nil || string(b) != "hello" {
		t.Fatalf("got %q %v", b, err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write after CloseWrite: %v", err)
	}
	s.Write([]byte("back"))
	buf := make([]byte, 10)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "back" {
		t.Fatalf("got %q %v", buf[:n], err)
	}
	// CloseRead on the server: client writes fail with EPIPE.
	s.CloseRead()
	c2, s2 := pair(t, l, nil)
	defer c2.Close()
	s2.CloseRead()
	if _, err := c2.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write to read-closed peer: %v", err)
	}
	if n, err := s2.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("read after CloseRead: %d %v", n, err)
	}
	s2.Close()
	// Close: the peer reads EOF, its writes fail.
	s.Close()
	if _, err := c.Read(buf); err != io.EOF {
		t.Fatalf("read after peer close: %v", err)
	}
	// Read deadline as net.Error with Timeout and os.ErrDeadlineExceeded.
	c3, s3 := pair(t, l, nil)
	defer c3.Close()
	defer s3.Close()
	c3.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err = c3.Read(buf)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("deadline error %v", err)
	}
	// A blocked reader wakes when a deadline is set from another goroutine.
	c3.SetReadDeadline(time.Time{})
	done := make(chan error)
	go func() { _, err := c3.Read(buf); done <- err }()
	time.Sleep(20 * time.Millisecond)
	c3.SetReadDeadline(time.Now())
	if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("blocked reader: %v", err)
	}
}

// threads returns the number of OS threads of this process.
func threads(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return -1
}

func fdCount(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// The backlog (spec section 3): a client that gets no answer within its short wait is
// established pending and may write at once; a late WELCOME, which comes without credentials,
// leaves its ring read through the memfd (as from another user: spec section 3, "Who answers")
// and the listener unknown; a late REJECT fails the connection with ECONNREFUSED.
func TestPendingDial(t *testing.T) {
	watchdog(t, 30*time.Second)
	l, err := ListenColo("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// The first answer is held until Dial has returned: a Dial that waited for it would never
	// return (the watchdog ends the test), so no time bound is needed.
	var mu sync.Mutex
	gate := make(chan struct{})
	delay, refuse := time.Duration(0), false
	answer := func(*Conn) bool {
		mu.Lock()
		g, d, r := gate, delay, refuse
		mu.Unlock()
		<-g
		time.Sleep(d)
		return !r
	}
	l.testAnswer.Store(&answer)
	go func() {
		for {
			s, err := l.AcceptColo()
			if err != nil {
				return
			}
			go func() { io.Copy(s, s); s.Close() }()
		}
	}()
	name := rendezvousName(netip.MustParseAddrPort(l.Addr().String()))
	welcomed.Delete(name)
	c, err := Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if c.Transport() != TransportColo || !c.pending.Load() {
		t.Fatalf("transport %v pending %v", c.Transport(), c.pending.Load())
	}
	close(gate)
	if c.in.file < 0 {
		t.Fatal("a pending connection reads its ring through its mapping: nobody vouched for its server")
	}
	c.Write([]byte("early"))
	b := make([]byte, 5)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "early" {
		t.Fatalf("echo through a pending connection: %q %v", b, err)
	}
	// The WELCOME went before the echo: read by a drain of the control socket, the read's
	// sleep's or, if the read never slept, Close's.
	c.Close()
	if _, ok := welcomed.Load(name); ok {
		t.Fatal("a WELCOME without credentials made its listener known")
	}
	// A remembered listener (one that answered in time as our uid): no wait at all; then a
	// late REJECT.
	welcomed.Store(name, int32(os.Getpid()))
	mu.Lock()
	delay, refuse = 20*time.Millisecond, true
	mu.Unlock()
	// (The gate is open now; the REJECT comes 20 ms after the HELLO, when Dial has returned.)
	c, err = Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = io.ReadFull(c, b)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("after a late REJECT: %v", err)
	}
}

// A reader wakes the writer only when the ring may have been full (notifySpace): a small ring,
// both directions at once, odd write and read sizes, with and without spinning, must never hang
// and must deliver every byte in order.
func TestFullRingWakeups(t *testing.T) {
	watchdog(t, 60*time.Second)
	l, err := ListenColo("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, spin := range []time.Duration{0, 5 * time.Microsecond} {
		c, s := pair(t, l, &Dialer{Geometry: Geometry{RingCapacity: 4096}})
		c.SetSpin(spin)
		s.SetSpin(spin)
		const total = 4 << 20
		errs := make(chan error, 4)
		send := func(w net.Conn, seed int) {
			sent := 0
			for k := 0; sent < total; k++ {
				n := min(1+(k*4099+seed)%7000, total-sent)
				chunk := make([]byte, n)
				for i := range chunk {
					chunk[i] = byte(sent + i)
				}
				if _, err := w.Write(chunk); err != nil {
					errs <- err
					return
				}
				sent += n
			}
			errs <- nil
		}
		recv := func(r net.Conn, seed int) {
			buf := make([]byte, 5000)
			got := 0
			for k := 0; got < total; k++ {
				n, err := r.Read(buf[:1+(k*131+seed)%len(buf)])
				if err != nil {
					errs <- err
					return
				}
				for i := 0; i < n; i++ {
					if buf[i] != byte(got+i) {
						errs <- fmt.Errorf("byte %d: got %d", got+i, buf[i])
						return
					}
				}
				got += n
			}
			errs <- nil
		}
		go send(c, 3)
		go send(s, 5)
		go recv(c, 7)
		go recv(s, 11)
		for i := 0; i < 4; i++ {
			if err := <-errs; err != nil {
				t.Fatalf("spin %v: %v", spin, err)
			}
		}
		c.Close()
		s.Close()
	}
}

// A reader waiting for data must sleep while the peer's CloseRead (NOT_READING in the peer's
// ring flags, which the reader watches) stays set: the bit concerns our writes, not our reads.
func TestReaderSleepsAfterPeerCloseRead(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	c, s := pair(t, l, nil)
	defer c.Close()
	defer s.Close()
	s.CloseRead()
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before := cpu()
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v", err)
	}
	if used := cpu() - before; used > 150*time.Millisecond {
		t.Fatalf("a reader waiting 300 ms used %v of CPU: it spun instead of sleeping", used)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write to a peer that stopped reading: %v", err)
	}
}

// An upload whose writer waits for space while another goroutine of the same connection waits
// for the response (net/http's Transport does this: its write loop and read loop) must finish.
// The writer's announcement could be taken by the peer's wake-up before the reader, the poller,
// reset the doorbell's readiness for its sleep; the ring was then lost to both, and the writer
// waited behind the reader for a response that comes only after the upload. The hook widens
// that window (without the fix in block, the first round hangs).
func TestUploadWhileTheReaderWaitsForTheResponse(t *testing.T) {
	watchdog(t, 60*time.Second)
	widen := func() { time.Sleep(200 * time.Microsecond) }
	testHookBeforePoll.Store(&widen)
	t.Cleanup(func() { testHookBeforePoll.Store(nil) })
	l := listen(t)
	for round := 0; round < 10; round++ {
		c, s := pair(t, l, nil)
		c.SetSpin(0) // sleep at once: more turns to lose
		go func() {  // the server: reads the whole upload, then answers
			io.Copy(io.Discard, s)
			s.Write([]byte{9})
			s.Close()
		}()
		answer := make(chan error, 1)
		go func() {
			b := make([]byte, 1)
			_, err := io.ReadFull(c, b)
			if err == nil && b[0] != 9 {
				err = fmt.Errorf("answer %d", b[0])
			}
			answer <- err
		}()
		uploaded := make(chan error, 1)
		go func() {
			buf := make([]byte, 64<<10)
			for i := 0; i < 256; i++ {
				if _, err := c.Write(buf); err != nil {
					uploaded <- err
					return
				}
			}
			uploaded <- c.CloseWrite()
		}()
		select {
		case err := <-uploaded:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the upload hung behind the waiting reader", round)
		}
		if err := <-answer; err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
}
