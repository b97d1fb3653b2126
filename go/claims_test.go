package colo

// Claims of docs/SAFETY.md and spec/WIRE.md about the Go listener, each checked by what it promises; the
// Rust listener's are in rust/colo/tests/claims.rs. Each fails if the code behind it is removed:
//
//   - a memfd whose size differs from its header's segment_size is refused (REJECT(BAD_SEGMENT));
//   - a memfd not on tmpfs (a sealed hugetlbfs one) is refused before it is mapped;
//   - the control socket carries only rings after the handshake: another datagram or a descriptor on it resets
//     the connection (ECONNRESET, RESET set in the segment); a zero-length datagram is a hang-up;
//   - a rendezvous client that sends no HELLO is dropped after helloTimeout, and at most
//     maxUnaccepted such clients are held (the rest wait in the kernel's backlog);
//   - exactly one of CLAIMED and ABANDONED wins a CARRIER race: both ends agree on the transport
//     and every byte arrives once.
//
// (A RECYCLE HELLO from another process: recycle_test.go; out-of-range message entries and
// releases: TestCorruptionResetsOnlyThatConn.)

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawClient is a client's side of a DIRECT connection made by hand.
type rawClient struct {
	ctl int
	seg []byte
	lay layout
}

func (r *rawClient) close() {
	unix.Close(r.ctl)
	if r.seg != nil {
		unix.Munmap(r.seg)
	}
}

// rawDirect sends HELLO(DIRECT) to l with a sealed segment of fileSize bytes whose header
// describes g (and the descriptors more after its memfd); it returns the client and the answer
// (nil if none).
func rawDirect(t *testing.T, l *Listener, g Geometry, fileSize uint64, more ...int) (*rawClient, []byte) {
	t.Helper()
	lay := g.layout()
	mfd, err := newSegmentFd(fileSize)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	seg, err := mapSegment(mfd, fileSize)
	if err != nil {
		t.Fatal(err)
	}
	server := netip.MustParseAddrPort(l.Addr().String())
	h := header{Geometry: g, SegmentSize: lay.segmentSize, Claim: ClaimDirect, ClientPid: uint32(os.Getpid()),
		ClientAddr: netip.AddrPortFrom(server.Addr(), 0), ServerAddr: server}
	h.encode(seg)
	if fileSize >= lay.segmentSize {
		startRings(seg, lay) // as a client does (spec section 5, "Growing and shrinking")
	}
	if err := sealSegment(mfd); err != nil {
		t.Fatal(err)
	}
	r := &rawClient{seg: seg, lay: lay}
	if r.ctl, err = unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Connect(r.ctl, &unix.SockaddrUnix{Name: "@" + rendezvousName(server)}); err != nil {
		t.Fatal(err)
	}
	hello := hsMsg{Type: MsgHello, Version: Version, Arg: ModeDirect}.encode()
	if err := unix.Sendmsg(r.ctl, hello, unix.UnixRights(append([]int{mfd}, more...)...), nil, 0); err != nil {
		t.Fatal(err)
	}
	unix.SetsockoptTimeval(r.ctl, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 10})
	buf := make([]byte, 64)
	n, _, _, _, err := unix.Recvmsg(r.ctl, buf, nil, 0)
	if err != nil || n == 0 {
		return r, nil
	}
	return r, buf[:n]
}

var smallGeometry = Geometry{RingCapacity: 4096}

func isMsg(b []byte, typ, arg uint8) bool {
	m, err := decodeMsg(b)
	return err == nil && m.Type == typ && m.Arg == arg
}

func TestClaimSegmentSizeDiffersFromHeader(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	size := smallGeometry.layout().segmentSize
	for _, file := range []uint64{size + 4096, size - 4096, headerSize} {
		r, a := rawDirect(t, l, smallGeometry, file)
		r.close()
		if !isMsg(a, MsgReject, RejectBadSegment) {
			t.Errorf("a %d-byte memfd whose header says %d: answer %x, want REJECT(BAD_SEGMENT)", file, size, a)
		}
	}
	// The same segment at its header's size is accepted: the size alone was refused.
	accepted := make(chan *Conn, 1)
	go func() {
		s, _ := l.AcceptColo()
		accepted <- s
	}()
	r, a := rawDirect(t, l, smallGeometry, size)
	defer r.close()
	if !isMsg(a, MsgWelcome, 0) {
		t.Fatalf("a memfd of its header's size: answer %x, want WELCOME", a)
	}
	if s := <-accepted; s != nil {
		s.Close()
	}
}

// A HELLO carries the segment's memfd alone (spec section 3): one with the two doorbell slots
// of the earlier layout (a Unix stream socket twice after the memfd) is refused
// REJECT(BAD_MESSAGE), and its client uses TCP; the same segment alone is welcomed.
func TestClaimHelloWithThreeDescriptorsRefused(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sp[0])
	defer unix.Close(sp[1])
	size := smallGeometry.layout().segmentSize
	r, a := rawDirect(t, l, smallGeometry, size, sp[1], sp[1])
	r.close()
	if !isMsg(a, MsgReject, RejectBadMessage) {
		t.Fatalf("a HELLO with three descriptors: answer %x, want REJECT(BAD_MESSAGE)", a)
	}
	accepted := make(chan *Conn, 1)
	go func() {
		s, _ := l.AcceptColo()
		accepted <- s
	}()
	r, a = rawDirect(t, l, smallGeometry, size)
	defer r.close()
	if !isMsg(a, MsgWelcome, 0) {
		t.Fatalf("the same HELLO with the memfd alone: answer %x, want WELCOME", a)
	}
	if s := <-accepted; s != nil {
		s.Close()
	}
}

// rawConnection is a DIRECT connection from a raw client, and the server's Conn.
func rawConnection(t *testing.T) (*rawClient, *Conn) {
	t.Helper()
	l := listen(t)
	accepted := make(chan *Conn, 1)
	go func() {
		s, _ := l.AcceptColo()
		accepted <- s
	}()
	r, a := rawDirect(t, l, smallGeometry, smallGeometry.layout().segmentSize)
	t.Cleanup(r.close)
	if !isMsg(a, MsgWelcome, 0) {
		t.Fatalf("answer %x, want WELCOME", a)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("no connection accepted")
	}
	t.Cleanup(func() { s.Close() })
	s.SetDeadline(time.Now().Add(10 * time.Second))
	return r, s
}

// serverFlags is the server's ring_flags (server->client block).
func (r *rawClient) serverFlags() uint32 {
	return atomic.LoadUint32(u32at(r.seg, headerSize+r.lay.blockSize+dRingFlags)) // SYNC POINT with the server's ORs of its ring_flags
}

// produce writes b into the client->server ring as its producer (a fresh ring, once).
func (r *rawClient) produce(b []byte) {
	copy(r.seg[headerSize+r.lay.dataOff:], b)
	// SYNC POINT with the server's load of ring_head (consumer.refresh): the bytes first.
	atomic.StoreUint64(u64at(r.seg, headerSize+dRingHead), uint64(len(b)))
}

// sendRights sends a datagram of no bytes carrying the descriptors in oob (unix.Sendmsg would
// add a dummy byte).
func sendRights(fd int, oob []byte) error {
	msg := unix.Msghdr{Control: &oob[0]}
	msg.SetControllen(len(oob))
	_, _, e := unix.Syscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// After the handshake the control socket carries rings alone (spec section 6): a datagram of
// another length, or one carrying descriptors, resets the connection (spec section 8). The
// server's socket refuses descriptors once the HELLO is read (SO_PASSRIGHTS, Linux 6.16), and
// is then drained without room for them; a kernel without the option is played by taking them
// again (drained one datagram at a time, with room).
func TestClaimControlSocketGarbageResets(t *testing.T) {
	watchdog(t, 60*time.Second)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	for _, oldKernel := range []bool{false, true} {
		for _, tc := range []struct {
			name   string
			rights bool
			send   func(r *rawClient) error
		}{
			{"five bytes", false, func(r *rawClient) error { return unix.Sendmsg(r.ctl, []byte("xxxxx"), nil, nil, 0) }},
			{"a message", false, func(r *rawClient) error {
				return unix.Sendmsg(r.ctl, hsMsg{Type: MsgWelcome, Version: Version}.encode(), nil, nil, 0)
			}},
			{"a ring and a descriptor", true, func(r *rawClient) error {
				return unix.Sendmsg(r.ctl, []byte{1}, unix.UnixRights(efd), nil, 0)
			}},
			{"a descriptor alone", true, func(r *rawClient) error { return sendRights(r.ctl, unix.UnixRights(efd)) }},
		} {
			r, s := rawConnection(t)
			if oldKernel {
				unix.SetsockoptInt(s.ctlFd, unix.SOL_SOCKET, soPassRights, 1)
				s.rightsOff = false // nobody else uses s yet
			}
			before := fdCount(t)
			err := tc.send(r)
			if tc.rights && s.rightsOff {
				if err != unix.EPERM {
					t.Errorf("%s: a control socket that refuses descriptors: %v", tc.name, err)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Read(make([]byte, 8)); !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("%s on the control socket (old kernel %v): read %v, want ECONNRESET", tc.name, oldKernel, err)
			}
			if r.serverFlags()&flagRESET == 0 {
				t.Errorf("%s on the control socket (old kernel %v): no RESET sent through the segment", tc.name, oldKernel)
			}
			if _, err := s.Write([]byte("y")); !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("%s on the control socket (old kernel %v): write %v, want ECONNRESET", tc.name, oldKernel, err)
			}
			if n := fdCount(t); n != before {
				t.Errorf("%s (old kernel %v): %d descriptors kept", tc.name, oldKernel, n-before)
			}
		}
	}
}

// Rings (one-byte datagrams) are what the control socket carries after the handshake: however
// many a peer sends, the connection goes on, and a read ends at the peer's hang-up queued behind
// more rings than one drain takes (drained in one system call or one datagram at a time).
func TestClaimControlSocketRingsAreNotGarbage(t *testing.T) {
	watchdog(t, 60*time.Second)
	for _, batch := range []bool{true, false} {
		r, s := rawConnection(t)
		s.rightsOff = s.rightsOff && batch // nobody else uses s yet
		for i := 0; i < 4*ctlDrainCalls; i++ {
			unix.Sendmsg(r.ctl, []byte{byte(i)}, nil, nil, unix.MSG_DONTWAIT)
		}
		r.produce([]byte("abc"))
		b := make([]byte, 8)
		if n, err := s.Read(b); err != nil || string(b[:n]) != "abc" {
			t.Fatalf("batch %v: read %q, %v", batch, b[:n], err)
		}
		if _, err := s.Write([]byte("y")); err != nil {
			t.Fatalf("batch %v: write after rings: %v", batch, err)
		}
		// The peer rings on, then dies (no FIN) while nothing polls: its hang-up is queued
		// behind more rings than one drain takes, and no edge will come for it.
		for i := 0; i < 4*ctlDrainCalls; i++ {
			unix.Sendmsg(r.ctl, []byte{byte(i)}, nil, nil, unix.MSG_DONTWAIT)
		}
		unix.Shutdown(r.ctl, unix.SHUT_RDWR)
		if _, err := s.Read(b); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("batch %v: read after a hang-up behind rings: %v, want ECONNRESET", batch, err)
		}
	}
}

// hangUpOutcome: what the server sees after the raw client wrote "abc" (and FIN if fin), then
// did hangUp to its control socket: the bytes read, the read's error, the write's error, and
// whether the server answered with a reset.
func hangUpOutcome(t *testing.T, fin bool, hangUp func(r *rawClient) error) (string, error, error, bool) {
	r, s := rawConnection(t)
	r.produce([]byte("abc"))
	if fin {
		atomic.OrUint32(u32at(r.seg, headerSize+dRingFlags), flagFIN) // after the bytes: SYNC POINT with the server's readSome
	}
	if err := hangUp(r); err != nil {
		t.Fatal(err)
	}
	got, rerr := io.ReadAll(s)
	_, werr := s.Write([]byte("y"))
	return string(got), rerr, werr, r.serverFlags()&flagRESET != 0
}

func errnoOf(err error) error {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return err
}

func TestClaimControlSocketEmptyDatagramIsHangUp(t *testing.T) {
	watchdog(t, 30*time.Second)
	empty := func(r *rawClient) error { return unix.Sendmsg(r.ctl, nil, nil, nil, 0) }
	closed := func(r *rawClient) error { return unix.Shutdown(r.ctl, unix.SHUT_RDWR) }
	for _, fin := range []bool{false, true} {
		got, rerr, werr, reset := hangUpOutcome(t, fin, empty)
		// The bytes before the hang-up are delivered, then EOF (FIN) or ECONNRESET (died);
		// no reset is sent (a reset would drop the bytes).
		if got != "abc" || (fin && rerr != nil) || (!fin && !errors.Is(rerr, syscall.ECONNRESET)) || reset {
			t.Errorf("fin %v, empty datagram: read %q, %v; reset sent %v", fin, got, rerr, reset)
		}
		// Exactly what a real hang-up gives.
		got2, rerr2, werr2, reset2 := hangUpOutcome(t, fin, closed)
		if got != got2 || errnoOf(rerr) != errnoOf(rerr2) || errnoOf(werr) != errnoOf(werr2) || reset != reset2 {
			t.Errorf("fin %v: an empty datagram gives (%q, %v, %v, reset %v), a hang-up (%q, %v, %v, reset %v)",
				fin, got, rerr, werr, reset, got2, rerr2, werr2, reset2)
		}
	}
}

// hungUp reports whether the server closed (or answered) the raw rendezvous connection fd.
func hungUp(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
	n, _ := unix.Poll(p, 0)
	return n > 0 && p[0].Revents != 0
}

// The claim of docs/SAFETY.md item 14 (helloTimeout and maxHalfOpenPerUID in listen.go):
// change them together. All the clients here are of one uid, so the per-uid bound is the one met.
const (
	claimedHelloTimeout = 5 * time.Second
	claimedMaxSilent    = 256
)

func TestClaimSilentRendezvousClients(t *testing.T) {
	watchdog(t, 60*time.Second)
	const extra = 64
	var lim unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	if lim.Cur < 2*(claimedMaxSilent+extra)+500 {
		lim.Cur = min(lim.Max, 65536)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 2*(claimedMaxSilent+extra)+500 {
			t.Fatalf("RLIMIT_NOFILE %d: too low for %d clients (%v)", lim.Cur, claimedMaxSilent+extra, err)
		}
	}
	l := listen(t)
	name := rendezvousName(netip.MustParseAddrPort(l.Addr().String()))
	before := fdCount(t)
	start := time.Now()
	var clients []int
	for i := 0; i < claimedMaxSilent+extra; i++ {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, fd)
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + name}); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, fd := range clients {
			unix.Close(fd)
		}
	}()
	count := func() (n int) {
		for _, fd := range clients {
			if hungUp(fd) {
				n++
			}
		}
		return n
	}
	// At most claimedMaxSilent are held by the listener (one descriptor each); the rest are
	// refused at once.
	time.Sleep(time.Second)
	if held := fdCount(t) - before - len(clients); held > claimedMaxSilent+20 {
		t.Errorf("the listener holds %d descriptors for %d silent clients (at most %d)", held, len(clients), claimedMaxSilent)
	}
	if n := count(); n != extra {
		t.Errorf("%d silent clients refused at once, want the %d beyond the bound", n, extra)
	}
	// None of those held is dropped before its time...
	time.Sleep(time.Until(start.Add(claimedHelloTimeout - 700*time.Millisecond)))
	if n := count(); n != extra {
		t.Errorf("%d silent clients dropped before %v (%d refused)", n-extra, claimedHelloTimeout, extra)
	}
	// ...and every one after it (those left in the backlog once the first are dropped).
	deadline := start.Add(2*claimedHelloTimeout + 5*time.Second)
	for count() < len(clients) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := count(); n != len(clients) {
		t.Errorf("%d of %d silent clients dropped", n, len(clients))
	}
	// The listener still serves.
	c, s := pair(t, l, nil)
	defer c.Close()
	defer s.Close()
	if c.Transport() != TransportColo {
		t.Error("fell back to TCP")
	}
}

// TestClaimCarrierRace: CARRIER dials whose deadline ends about when the listener claims the
// offer, so that the client's OFFERED -> ABANDONED and the server's OFFERED -> CLAIMED race.
// Whoever wins, both ends use the same transport (the server reports its own with the echo) and
// the bytes arrive once.
func TestClaimCarrierRace(t *testing.T) {
	watchdog(t, 120*time.Second)
	l := listen(t)
	go func() {
		for {
			s, err := l.AcceptColo()
			if err != nil {
				return
			}
			go func(s *Conn) {
				defer s.Close()
				s.SetDeadline(time.Now().Add(10 * time.Second))
				b := make([]byte, 8, 9)
				if _, err := io.ReadFull(s, b); err != nil {
					return
				}
				tr := byte('t')
				if s.Transport() == TransportColo {
					tr = 'c'
				}
				s.Write(append(b, tr))
			}(s)
		}
	}()
	var colo, plain int
	for i := 0; i < 400; i++ {
		d := &Dialer{forceCarrier: true, Timeout: time.Duration(20+(i*7919)%1000) * time.Microsecond}
		c, err := d.Dial("tcp", l.Addr().String())
		if err != nil {
			continue // the deadline came before the TCP connection: no race
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		msg := fmt.Sprintf("%08d", i)
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatalf("dial %d: write: %v", i, err)
		}
		b := make([]byte, 9)
		n, err := io.ReadFull(c, b)
		if err != nil || string(b[:8]) != msg {
			t.Fatalf("dial %d (%v): echo %q, %v: the two ends disagree on the transport", i, c.Transport(), b[:n], err)
		}
		mine := byte('t')
		if c.Transport() == TransportColo {
			mine = 'c'
			colo++
		} else {
			plain++
		}
		if b[8] != mine {
			t.Fatalf("dial %d: the client is on %q, the server on %q", i, mine, b[8])
		}
		if extra, err := c.Read(b); extra != 0 || err != io.EOF {
			t.Fatalf("dial %d: after the echo: %d more bytes, %v", i, extra, err)
		}
		c.Close()
	}
	t.Logf("CARRIER race: %d claimed, %d abandoned", colo, plain)
	if colo == 0 || plain == 0 {
		t.Fatalf("the race was not run both ways: %d claimed, %d abandoned", colo, plain)
	}
}

// A hugetlbfs memfd, sealed and of a good size, is refused before it is mapped (a fault in a
// page its owner punched raises SIGBUS once no huge page is free, and ends the program).
func TestHugetlbfsMemfdIsRefused(t *testing.T) {
	fd, err := unix.MemfdCreate("colo-seg", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_HUGETLB)
	if err != nil {
		t.Skipf("no hugetlbfs memfd on this kernel: nothing to refuse (%v)", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 2<<20); err != nil {
		t.Skipf("hugetlbfs memfd of 2 MiB: %v", err)
	}
	if err := sealSegment(fd); err != nil {
		t.Fatal(err)
	}
	if _, err := checkSegmentFd(fd); !errors.Is(err, errBadSegment) {
		t.Fatalf("a sealed hugetlbfs memfd was not refused as a bad segment: %v", err)
	}
}
