package colo

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Recycling (spec/WIRE.md section 3): a client that dials the same listener again reuses a
// segment both sides parked, and the new connection behaves exactly like a fresh one. Segments
// are told apart by the inode of their memfd, read from /proc/self/maps (this package closes a
// segment's memfd once it is mapped, so /proc/self/fd does not show them).

// segInode returns the memfd inode of the mapping that starts at seg.
func segInode(t testing.TB, seg []byte) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	start := strconv.FormatUint(uint64(uintptr(unsafe.Pointer(&seg[0]))), 16)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && strings.HasPrefix(f[0], start+"-") && strings.HasPrefix(f[5], "/memfd:colo") {
			ino, _ := strconv.ParseUint(f[4], 10, 64)
			return ino
		}
	}
	t.Fatalf("no memfd mapping at %s", start)
	return 0
}

// mappedInodes counts the mappings of each memfd segment of this process.
func mappedInodes(t testing.TB) map[uint64]int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	m := map[uint64]int{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && strings.HasPrefix(f[5], "/memfd:colo") {
			ino, _ := strconv.ParseUint(f[4], 10, 64)
			m[ino]++
		}
	}
	return m
}

func recyclePattern(i, j int) byte { return byte((i*1_000_003 + j) % 251) }

// echoUntilEOF serves n connections one after the other: echo until EOF, close, then report.
func echoUntilEOF(l *Listener, n int) (closed chan *Conn) {
	closed = make(chan *Conn, 1)
	go func() {
		for i := 0; i < n; i++ {
			s, err := l.AcceptColo()
			if err != nil {
				close(closed)
				return
			}
			io.Copy(s, s)
			s.Close()
			closed <- s
		}
	}()
	return closed
}

// roundTrip writes data while reading the echo concurrently, half-closes, and returns the echo.
func roundTrip(t testing.TB, c *Conn, data []byte) []byte {
	t.Helper()
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.CloseWrite()
		}
		werr <- err
	}()
	back, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	return back
}

func TestRecycleSequentialConnections(t *testing.T) {
	watchdog(t, 120*time.Second)
	l := listen(t)
	const n = 100
	closed := echoUntilEOF(l, n)
	seen := map[uint64]bool{}
	for i := 0; i < n; i++ {
		c, err := Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if c.Transport() != TransportColo {
			t.Fatal("fell back to TCP")
		}
		seen[segInode(t, c.seg)] = true
		// From 1 byte to more than twice the ring's capacity, so recycled rings wrap too.
		data := make([]byte, 1+(i*7919)%600_000)
		for j := range data {
			data[j] = recyclePattern(i, j)
		}
		if back := roundTrip(t, c, data); !bytes.Equal(back, data) {
			t.Fatalf("connection %d: %d bytes back of %d, or different", i, len(back), len(data))
		}
		c.Close()
		if <-closed == nil {
			t.Fatal("accept failed")
		}
	}
	// Without recycling every connection brings a new segment; with it, the first dial builds
	// one and the others reuse it.
	t.Logf("%d segments for %d sequential connections", len(seen), n)
	if len(seen) > 10 {
		t.Fatalf("%d segments for %d sequential connections", len(seen), n)
	}
}

func TestRecycledPoolStartsFull(t *testing.T) {
	watchdog(t, 60*time.Second)
	l := listen(t)
	answeredBefore(l)
	d := &Dialer{Geometry: Geometry{RingCapacity: 4096, SlotSize: 4096, SlotCount: 4}}
	serverDone := make(chan error, 1)
	closed := make(chan struct{})
	go func() {
		serverDone <- func() error {
			// First connection: release one message, keep two unreleased, close.
			s, err := l.AcceptColo()
			if err != nil {
				return err
			}
			m, err := s.Recv()
			if err != nil || string(m.Data) != "first" {
				return fmt.Errorf("first message: %v", err)
			}
			m.Release()
			for k := 0; k < 2; k++ {
				if _, err := s.Recv(); err != nil {
					return err
				}
			}
			if _, err := s.Read(make([]byte, 1)); err != io.EOF {
				return fmt.Errorf("want EOF, got %v", err)
			}
			s.Close()
			close(closed)
			// Second connection: four messages, each with its own bytes.
			if s, err = l.AcceptColo(); err != nil {
				return err
			}
			defer s.Close()
			for k := 0; k < 4; k++ {
				m, err := s.Recv()
				if err != nil || !bytes.Equal(m.Data, bytes.Repeat([]byte{byte(k)}, 4096)) {
					return fmt.Errorf("message %d: %v", k, err)
				}
				m.Release()
			}
			_, err = s.Write([]byte("done"))
			return err
		}()
	}()
	c := dialColoOnly(t, l, d)
	for _, text := range []string{"first", "second", "third"} {
		m, err := c.Loan(len(text))
		if err != nil {
			t.Fatal(err)
		}
		copy(m.Data, text)
		if err := c.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	first := segInode(t, c.seg)
	c.Close()
	<-closed
	c = dialColoOnly(t, l, d)
	defer c.Close()
	if got := segInode(t, c.seg); got != first {
		t.Fatalf("the second connection has segment %d, not the first one's (%d)", got, first)
	}
	// Four loans at once: no slot is still held from the first connection.
	var loans []*Message
	for k := 0; k < 4; k++ {
		m, err := c.Loan(4096)
		if err != nil {
			t.Fatalf("loan %d: %v", k, err)
		}
		loans = append(loans, m)
	}
	for k, m := range loans {
		for j := range m.Data {
			m.Data[j] = byte(k)
		}
		if err := c.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "done" {
		t.Fatalf("%q %v", b, err)
	}
	if err := <-serverDone; err != nil {
		t.Fatal(err)
	}
}

// dialColoOnly dials l (another goroutine accepts) and fails unless the connection is colo.
// answeredBefore has l taken for a listener that answered this process in time, as its uid:
// a dial to it goes pending without waiting, reads its ring through its mapping and parks its
// segment at a clean close, however late the accepting goroutine runs (a first answer that comes
// after firstAnswerWait leaves its connection read through the memfd, never parked).
func answeredBefore(l *Listener) {
	welcomed.Store(rendezvousName(netip.MustParseAddrPort(l.Addr().String())), int32(os.Getpid()))
}

func dialColoOnly(t *testing.T, l *Listener, d *Dialer) *Conn {
	t.Helper()
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if c.Transport() != TransportColo {
		t.Fatal("fell back to TCP")
	}
	return c
}

func TestRecycleParkedReleasedAfterASecond(t *testing.T) {
	watchdog(t, 60*time.Second)
	dropParkedClient()
	drainSegPool()
	l := listen(t)
	answeredBefore(l)
	before := fdCount(t)
	closed := echoUntilEOF(l, 2)
	c, err := Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ino := segInode(t, c.seg)
	if back := roundTrip(t, c, []byte("x")); string(back) != "x" {
		t.Fatalf("echo %q", back)
	}
	c.Close()
	<-closed
	parkedAt := time.Now()
	// Both sides keep it parked (mapped twice, without a descriptor: the control socket was the
	// connection's) for a while...
	if n := mappedInodes(t)[ino]; n != 2 {
		t.Fatalf("parked segment mapped %d times, want 2", n)
	}
	drainSegPool()
	if got := fdCount(t); got != before {
		t.Fatalf("%d descriptors while parked, want %d", got, before)
	}
	// ...and let go of it after about a second (the dial's segment pool refills meanwhile: not
	// counted).
	held := func() bool {
		drainSegPool()
		return mappedInodes(t)[ino] > 0 || fdCount(t) > before
	}
	for held() {
		if time.Since(parkedAt) > 5*time.Second {
			t.Fatalf("parked segment still held after %v: %d mappings, %d descriptors (%d before)",
				time.Since(parkedAt), mappedInodes(t)[ino], fdCount(t), before)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if d := time.Since(parkedAt); d < 900*time.Millisecond {
		t.Fatalf("released after %v, before a second", d)
	}
	// With nothing parked, no sweeper runs.
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		sweeper.Lock()
		running := sweeper.running
		sweeper.Unlock()
		if !running {
			break
		}
		if time.Since(start) > 3*time.Second {
			t.Fatal("the sweeper still runs with nothing parked")
		}
	}
	// A dial after both sides let go builds a new segment and works.
	c, err = Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if segInode(t, c.seg) == ino {
		t.Fatal("a released segment was used again")
	}
	if back := roundTrip(t, c, []byte("y")); string(back) != "y" {
		t.Fatalf("echo %q", back)
	}
	c.Close()
	<-closed
}

// recycleHello is a RECYCLE HELLO naming ticket.
func recycleHello(ticket uint32) []byte {
	return hsMsg{Type: MsgHello, Version: Version, Arg: ModeDirect, Flags: flagRecycle, Ticket: ticket}.encode()
}

// recycleHelloHelper is the test binary as another process: it sends a RECYCLE HELLO with the
// ticket COLO_TEST_TICKET to the rendezvous COLO_TEST_NAME and prints the answer's REJECT reason.
func recycleHelloHelper() {
	ticket, _ := strconv.ParseUint(os.Getenv("COLO_TEST_TICKET"), 10, 32)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + os.Getenv("COLO_TEST_NAME")})
	}
	if err == nil {
		err = unix.Sendmsg(fd, recycleHello(uint32(ticket)), nil, nil, 0)
	}
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	buf := make([]byte, 64)
	n, _, _, _, _ := unix.Recvmsg(fd, buf, nil, 0)
	m, err := decodeMsg(buf[:max(n, 0)])
	if err != nil || m.Type != MsgReject {
		fmt.Println("no reject")
		os.Exit(1)
	}
	fmt.Println(m.Arg)
}

// serverTickets returns the tickets the listener holds parked segments under.
func serverTickets(l *Listener) []uint32 {
	l.parked.mu.Lock()
	defer l.parked.mu.Unlock()
	var ts []uint32
	for _, e := range l.parked.list {
		ts = append(ts, e.ticket)
	}
	return ts
}

func TestRecycleHelloRefused(t *testing.T) {
	watchdog(t, 60*time.Second)
	l := listen(t)
	answeredBefore(l)
	name := rendezvousName(netip.MustParseAddrPort(l.Addr().String()))
	rejectOf := func(b []byte) int {
		m, err := decodeMsg(b)
		if err != nil || m.Type != MsgReject {
			return -1
		}
		return int(m.Arg)
	}
	// No segment parked under that ticket.
	if got := rejectOf(rawHello(t, name, recycleHello(12345), nil)); got != RejectBadSegment {
		t.Errorf("unknown ticket: reject reason %d, want %d", got, RejectBadSegment)
	}
	// Descriptors with a RECYCLE HELLO.
	efd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if got := rejectOf(rawHello(t, name, recycleHello(1), []int{efd, efd, efd})); got != RejectBadMessage {
		t.Errorf("with descriptors: reject reason %d, want %d", got, RejectBadMessage)
	}
	unix.Close(efd)
	// A segment both sides parked, named before the client took it back (parked is not 0).
	closed := echoUntilEOF(l, 2)
	c, err := Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	first := segInode(t, c.seg)
	roundTrip(t, c, []byte("a"))
	c.Close()
	<-closed
	parkedAt := time.Now()
	tickets := serverTickets(l)
	if len(tickets) != 1 {
		t.Fatalf("listener parked %d segments, want 1", len(tickets))
	}
	if got := rejectOf(rawHello(t, name, recycleHello(tickets[0]), nil)); got != RejectBadSegment {
		t.Errorf("parked not 0: reject reason %d, want %d", got, RejectBadSegment)
	}
	// The same ticket from another process.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "COLO_TEST_HELPER=recycle-hello", "COLO_TEST_NAME="+name,
		"COLO_TEST_TICKET="+strconv.FormatUint(uint64(tickets[0]), 10))
	out, err := cmd.Output()
	if got := strings.TrimSpace(string(out)); err != nil || got != strconv.Itoa(RejectBadSegment) {
		t.Errorf("another process: answer %q (%v), want reject reason %d", got, err, RejectBadSegment)
	}
	// The listener keeps serving, and the refused HELLOs did not take the parked segment away
	// (unless a loaded machine took so long that it was let go of meanwhile).
	fresh := time.Since(parkedAt) < parkIdle*3/4
	c, err = Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if c.Transport() != TransportColo {
		t.Fatal("fell back to TCP")
	}
	if got := segInode(t, c.seg); got != first && fresh {
		t.Errorf("segment %d, not the parked one (%d)", got, first)
	}
	if back := roundTrip(t, c, []byte("still serving")); string(back) != "still serving" {
		t.Fatalf("echo %q", back)
	}
	c.Close()
	<-closed
}

// The Rust peer (tests/xlang/PEER.md) as the server of several sequential short connections from
// this process: each gets its echo intact, and the segments are reused.
func TestRecycleWithRustPeer(t *testing.T) {
	watchdog(t, 120*time.Second)
	peer, _ := filepath.Abs(filepath.Join("..", "rust", "target", "release", "examples", "peer"))
	if _, err := os.Stat(peer); err != nil {
		// make test builds the peer first and sets COLO_REQUIRE_RUST_PEER: there, a skip is a failure.
		if os.Getenv("COLO_REQUIRE_RUST_PEER") != "" {
			t.Fatalf("the Rust peer is not built (%v)", err)
		}
		t.Skipf("the Rust peer is not built (%v): cd rust && cargo build --release -p colo --example peer", err)
	}
	cmd := exec.Command(peer, "server", "127.0.0.1:0", "stream")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "READY ")
	if err != nil || !ok {
		t.Fatalf("peer said %q (%v)", line, err)
	}
	const n = 30
	seen := map[uint64]bool{}
	for i := 0; i < n; i++ {
		c, err := Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if c.Transport() != TransportColo {
			t.Fatal("fell back to TCP")
		}
		seen[segInode(t, c.seg)] = true
		data := make([]byte, 1+(i*7919)%600_000)
		for j := range data {
			data[j] = recyclePattern(i, j)
		}
		if back := roundTrip(t, c, data); !bytes.Equal(back, data) {
			t.Fatalf("connection %d: %d bytes back of %d, or different", i, len(back), len(data))
		}
		c.Close()
		// The peer closes its side after its FIN; give it the time to park it.
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d segments for %d sequential connections to the Rust peer", len(seen), n)
	if len(seen) > n/3 {
		t.Fatalf("%d segments for %d sequential connections: not reused", len(seen), n)
	}
}
