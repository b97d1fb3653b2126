package colo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain lets the test binary act as a helper peer process for the fault tests.
func TestMain(m *testing.M) {
	switch os.Getenv("COLO_TEST_HELPER") {
	case "":
		os.Exit(m.Run())
	case "writer":
		// Dial, then write forever (until killed).
		c, err := Dial("tcp", os.Getenv("COLO_TEST_ADDR"))
		if err != nil || c.Transport() != TransportColo {
			fmt.Fprintln(os.Stderr, "helper dial:", err)
			os.Exit(2)
		}
		buf := make([]byte, 32<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				os.Exit(3)
			}
		}
	case "idle":
		c, err := Dial("tcp", os.Getenv("COLO_TEST_ADDR"))
		if err != nil || c.Transport() != TransportColo {
			os.Exit(2)
		}
		c.Write([]byte{1})
		time.Sleep(time.Hour)
	case "recycle-hello":
		recycleHelloHelper()
	case "reader":
		c, err := Dial("tcp", os.Getenv("COLO_TEST_ADDR"))
		if err != nil || c.Transport() != TransportColo {
			os.Exit(2)
		}
		c.Write([]byte{1})
		time.Sleep(time.Hour) // never reads: the parent's writes fill the ring
	}
}

func startHelper(t *testing.T, role, addr string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "COLO_TEST_HELPER="+role, "COLO_TEST_ADDR="+addr)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

func TestPeerKilledMidTransfer(t *testing.T) {
	watchdog(t, 60*time.Second)
	l := listen(t)
	// The peer writes; we read; it is killed: our reads end with ECONNRESET (or EOF) promptly.
	cmd := startHelper(t, "writer", l.Addr().String())
	s, err := l.AcceptColo()
	if err != nil || s.Transport() != TransportColo {
		t.Fatalf("accept: %v", err)
	}
	defer s.Close()
	buf := make([]byte, 64<<10)
	var total int
	for total < 8<<20 {
		n, err := s.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	cmd.Process.Kill()
	start := time.Now()
	for {
		_, err := s.Read(buf)
		if err == nil {
			continue
		}
		if !errors.Is(err, syscall.ECONNRESET) && err != io.EOF {
			t.Fatalf("read after peer death: %v", err)
		}
		break
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("peer death noticed after %v", d)
	}
	// The peer reads nothing and is killed while we are blocked writing: EPIPE or ECONNRESET.
	cmd = startHelper(t, "reader", l.Addr().String())
	s2, err := l.AcceptColo()
	if err != nil || s2.Transport() != TransportColo {
		t.Fatalf("accept: %v", err)
	}
	defer s2.Close()
	s2.Read(buf[:1])
	errc := make(chan error, 1)
	go func() {
		for {
			if _, err := s2.Write(buf); err != nil {
				errc <- err
				return
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)
	cmd.Process.Kill()
	if err := <-errc; !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("write after peer death: %v", err)
	}
}

func TestPeerDiedWhileNobodyWaited(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	cmd := startHelper(t, "idle", l.Addr().String())
	s, err := l.AcceptColo()
	if err != nil || s.Transport() != TransportColo {
		t.Fatalf("accept: %v", err)
	}
	defer s.Close()
	buf := make([]byte, 10)
	if _, err := s.Read(buf); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	time.Sleep(100 * time.Millisecond) // the hang-up arrives while no operation waits
	if _, err := s.Read(buf); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after peer death: %v", err)
	}
	if _, err := s.Write(buf); !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("write after peer death: %v", err)
	}
}

func TestCorruptionResetsOnlyThatConn(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	c1, s1 := pair(t, l, nil)
	c2, s2 := pair(t, l, nil)
	defer c1.Close()
	defer s1.Close()
	defer c2.Close()
	defer s2.Close()
	// The "client" of pair 1 corrupts its ring head: far beyond the capacity.
	*c1.out.head = 1 << 40
	buf := make([]byte, 10)
	_, err := s1.Read(buf)
	if !errors.Is(err, syscall.EPROTO) {
		t.Fatalf("read of corrupt ring: %v", err)
	}
	var pe *ProtocolError
	if !errors.As(err, &pe) {
		t.Fatalf("not a ProtocolError: %T", err)
	}
	// The server reset the connection: the client sees ECONNRESET.
	if _, err := c1.Read(buf); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client of reset conn: %v", err)
	}
	// Pair 2 is untouched.
	go c2.Write([]byte("fine"))
	n, err := io.ReadFull(s2, buf[:4])
	if err != nil || string(buf[:n]) != "fine" {
		t.Fatalf("other conn: %q %v", buf[:n], err)
	}
	// A released slot that is not in flight, and an out-of-range message entry.
	c3, s3 := pair(t, l, nil)
	defer c3.Close()
	defer s3.Close()
	n3 := uint64(c3.lay.SlotCount)
	putLE32(c3.out.freeEnt, 0, 5)
	*c3.out.freeHead = 1 // as if the server released slot 5, never sent
	var ms []*Message
	for i := uint64(0); i <= n3; i++ {
		m, err := c3.Loan(1)
		if err != nil {
			if !errors.Is(err, syscall.EPROTO) {
				t.Fatalf("loan with bogus release: %v", err)
			}
			break
		}
		ms = append(ms, m)
	}
	if uint64(len(ms)) != n3 {
		t.Fatalf("loaned %d of %d before the error", len(ms), n3)
	}
	c4, s4 := pair(t, l, nil)
	defer c4.Close()
	defer s4.Close()
	putLE32(c4.out.msgEnt, 0, 1000)
	*c4.out.msgHead = 1
	if _, err := s4.Recv(); !errors.Is(err, syscall.EPROTO) {
		t.Fatalf("recv of bad entry: %v", err)
	}
	// Unknown flag bits.
	c5, s5 := pair(t, l, nil)
	defer c5.Close()
	defer s5.Close()
	*c5.out.flags = 0x80
	if _, err := s5.Read(buf); !errors.Is(err, syscall.EPROTO) {
		t.Fatalf("unknown flags: %v", err)
	}
}

// rawHello connects to the rendezvous name and sends one datagram with optional descriptors;
// it returns the answer (nil if the socket closed without one).
func rawHello(t *testing.T, name string, msg []byte, fds []int) []byte {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + name}); err != nil {
		t.Fatal(err)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(fd, msg, oob, nil, 0); err != nil {
		t.Fatal(err)
	}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	buf := make([]byte, 64)
	n, _, _, _, err := unix.Recvmsg(fd, buf, nil, 0)
	if err != nil || n == 0 {
		return nil
	}
	return buf[:n]
}

func TestGarbageOnRendezvous(t *testing.T) {
	watchdog(t, 60*time.Second)
	drainSegPool()
	before := fdCount(t)
	l := listen(t)
	name := rendezvousName(netip.MustParseAddrPort(l.Addr().String()))
	rejectOf := func(b []byte) int {
		m, err := decodeMsg(b)
		if err != nil || m.Type != MsgReject {
			return -1
		}
		return int(m.Arg)
	}
	hello := hsMsg{Type: MsgHello, Version: Version, Arg: ModeDirect}.encode()
	var p [2]int
	unix.Pipe2(p[:], unix.O_CLOEXEC)
	// An unsealed memfd of the right shape.
	g := DefaultGeometry
	lay := g.layout()
	mfd, _ := unix.MemfdCreate("x", unix.MFD_CLOEXEC)
	unix.Ftruncate(mfd, int64(lay.segmentSize))
	efd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
	cases := []struct {
		name string
		msg  []byte
		fds  []int
		want int
	}{
		{"short", []byte("hi"), nil, RejectBadMessage},
		{"long", make([]byte, 40), nil, RejectBadMessage},
		{"bad magic", append([]byte("XOLO"), hello[4:]...), nil, RejectBadMessage},
		{"no fds", hello, nil, RejectBadMessage},
		{"bad version", hsMsg{Type: MsgHello, Version: 9, Arg: ModeDirect}.encode(), []int{p[0]}, RejectBadVersion},
		{"welcome from client", hsMsg{Type: MsgWelcome, Version: 1}.encode(), nil, RejectBadMessage},
		{"a pipe", hello, []int{p[0]}, RejectBadSegment},
		{"unsealed memfd", hello, []int{mfd}, RejectBadSegment},
		{"two fds", hello, []int{mfd, efd}, RejectBadMessage},
		{"three fds", hello, []int{mfd, efd, efd}, RejectBadMessage},
	}
	for _, tc := range cases {
		if got := rejectOf(rawHello(t, name, tc.msg, tc.fds)); got != tc.want {
			t.Errorf("%s: reject reason %d, want %d", tc.name, got, tc.want)
		}
	}
	// A sealed memfd of the right size whose header is garbage.
	sfd, _ := newSegmentFd(lay.segmentSize)
	sealSegment(sfd)
	if got := rejectOf(rawHello(t, name, hello, []int{sfd})); got != RejectBadSegment {
		t.Errorf("garbage header: %d", got)
	}
	unix.Close(sfd)
	// Silent clients and clients that vanish do not block others.
	var silent []int
	for i := 0; i < 20; i++ {
		fd, _ := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + name})
		silent = append(silent, fd)
	}
	// Concurrent garbage while real clients connect.
	var wg sync.WaitGroup
	var stop atomic.Bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load() && i < 500; i++ {
			rawHello(t, name, []byte{byte(i), 1, 2, 3}, nil)
		}
	}()
	for i := 0; i < 20; i++ {
		c, s := pair(t, l, nil)
		if c.Transport() != TransportColo {
			t.Fatal("fell back to TCP")
		}
		c.Write([]byte("ok"))
		b := make([]byte, 2)
		io.ReadFull(s, b)
		c.Close()
		s.Close()
	}
	stop.Store(true)
	wg.Wait()
	for _, fd := range append(silent, p[0], p[1], mfd, efd) {
		unix.Close(fd)
	}
	l.Close()
	waitFds(t, before)
}

// waitFds waits for the fd count to come back to want (descriptors close asynchronously).
func waitFds(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		drainSegPool()
		dropParkedClient()
		runtime.GC()
		got := fdCount(t)
		if got <= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fd leak: %d open, want %d", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNoFdLeak(t *testing.T) {
	watchdog(t, 60*time.Second)
	drainSegPool()
	before := fdCount(t)
	l, err := ListenColo("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		c, s := pair(t, l, nil)
		go func() { io.Copy(s, s); s.Close() }()
		c.Write(make([]byte, 1000))
		io.ReadFull(c, make([]byte, 1000))
		if i%2 == 0 {
			c.Close()
		} else {
			c.CloseWrite()
			io.ReadAll(c)
			c.Close()
		}
	}
	// Fallback conns too.
	for i := 0; i < 10; i++ {
		c, s := pair(t, l, &Dialer{TCPOnly: true})
		c.Close()
		s.Close()
	}
	l.Close()
	waitFds(t, before)
}

func TestIdleConnsDoNotPinThreads(t *testing.T) {
	watchdog(t, 120*time.Second)
	// Each end holds 3 descriptors and, with its control-socket watcher and a blocked reader, 2
	// goroutines; both ends live in this process, and the race detector allows 8128 goroutines.
	n := 1500
	if testing.Short() {
		n = 300
	}
	var lim unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	if need := uint64(n*6 + 500); lim.Cur < need {
		n = int((lim.Cur - 500) / 6)
	}
	l := listen(t)
	base := threads(t)
	conns := make([]*Conn, 0, 2*n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		c, s := pair(t, l, &Dialer{Geometry: Geometry{RingCapacity: 4096}})
		conns = append(conns, c, s)
		wg.Add(2)
		go func() { defer wg.Done(); io.Copy(io.Discard, c) }()
		go func() { defer wg.Done(); io.Copy(io.Discard, s) }()
	}
	time.Sleep(200 * time.Millisecond) // every reader is parked
	got := threads(t)
	t.Logf("%d idle colo connections (%d blocked readers): %d threads (%d before)", n, 2*n, got, base)
	if got > base+50 {
		t.Errorf("%d threads for %d blocked readers", got, 2*n)
	}
	for _, c := range conns {
		c.Close()
	}
	wg.Wait()
}

// Spec section 3, the backlog: a client whose connection was pending may write, close and go
// away before the server answers; the server still delivers the bytes, then EOF.
func TestPendingClientClosedBeforeWelcome(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	ap := netip.MustParseAddrPort(l.Addr().String())
	res, err := newSegRes(DefaultGeometry)
	if err != nil {
		t.Fatal(err)
	}
	lay := res.lay
	msg := []byte("written while pending")
	base := uint64(headerSize)
	copy(res.seg[base+lay.dataOff:], msg)
	*u64at(res.seg, base+dRingHead) = uint64(len(msg))
	*u32at(res.seg, base+dRingFlags) = flagFIN
	fd, err := connectRendezvous(context.Background(), rendezvousName(ap))
	if err != nil {
		t.Fatal(err)
	}
	cs := &clientSide{ctl: os.NewFile(uintptr(fd), "ctl"), fd: fd, segRes: res}
	if err := cs.hello(header{Claim: ClaimDirect, ClientAddr: netip.AddrPortFrom(ap.Addr(), 0), ServerAddr: ap}, ModeDirect); err != nil {
		t.Fatal(err)
	}
	cs.close() // gone before any answer
	s, err := l.AcceptColo()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := io.ReadAll(s)
	if err != nil || string(got) != string(msg) {
		t.Fatalf("got %q, %v", got, err)
	}
}
