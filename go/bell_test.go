package colo

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// blockingFd clears O_NONBLOCK: the worst a peer sharing the description could do to it.
func blockingFd(t *testing.T, fd int) {
	t.Helper()
	if err := unix.SetNonblock(fd, false); err != nil {
		t.Fatal(err)
	}
}

func openFds(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// Ringing and draining a doorbell pair never block, whatever the description's flags and however
// full its buffer; an end shut down or closed is a hang-up; descriptors sent along are never
// kept.
func TestBellNeverBlocks(t *testing.T) {
	watchdog(t, 30*time.Second)
	a, b, err := newBellPair()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(a)
	blockingFd(t, a)
	blockingFd(t, b)
	for i := 0; i < 200000; i++ { // far more than the buffers hold: the rest fail with EAGAIN
		ringBell(a)
	}
	drains := 0
	for {
		rung, hungUp := drainBell(b)
		if hungUp {
			t.Fatal("a full doorbell taken for a hang-up")
		}
		if !rung {
			break
		}
		if drains++; drains > 100000 {
			t.Fatal("the drain never emptied the buffer")
		}
	}
	if rung, hungUp := drainBell(b); rung || hungUp {
		t.Fatalf("an empty blocking doorbell: rung %v, hung up %v", rung, hungUp)
	}
	// Descriptors a peer sends along with its rings: a pair refuses them where the kernel can
	// (SO_PASSRIGHTS); queued anyway (before a server could refuse them, or on an older kernel),
	// a drain closes them.
	efd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if refuseRights(b) {
		if err := unix.Sendmsg(a, []byte{1}, unix.UnixRights(efd), nil, 0); err != unix.EPERM {
			t.Fatalf("a descriptor sent to a doorbell that refuses them: %v", err)
		}
		unix.SetsockoptInt(b, unix.SOL_SOCKET, soPassRights, 1)
	}
	for i := 0; i < 8; i++ {
		if err := unix.Sendmsg(a, []byte{1}, unix.UnixRights(efd), nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	unix.Close(efd)
	before := openFds(t)
	for i := 0; i < 100; i++ {
		if rung, _ := drainBell(b); !rung {
			break
		}
	}
	if n := openFds(t); n != before {
		t.Fatalf("draining installed %d descriptors", n-before)
	}
	// The peer shuts its end down: a ring, then the hang-up.
	ringBell(a)
	unix.Shutdown(a, unix.SHUT_WR)
	if rung, hungUp := drainBell(b); !rung || !hungUp {
		t.Fatalf("after the peer's shutdown: rung %v, hung up %v", rung, hungUp)
	}
	// Ringing a peer that is gone raises no SIGPIPE.
	unix.Close(b)
	ringBell(a)
	if !isDoorbell(a) {
		t.Fatal("a socket pair end is a doorbell")
	}
}

// A peer that fills our doorbell and makes it blocking, or shuts its end down, cannot hang our
// operations: rings into a full blocking doorbell return at once, and a doorbell whose other end
// was shut down is a hang-up that ends a blocked read. (A peer that stuffs our doorbell can make
// its own rings fail, and so stall its own connection, as a peer that never rings does.)
func TestPeerAbusingItsDoorbell(t *testing.T) {
	watchdog(t, 60*time.Second)
	l := listen(t)
	c, s := pair(t, l, &Dialer{})
	defer c.Close()
	defer s.Close()
	blockingFd(t, s.ownBell)
	blockingFd(t, c.ownBell)
	for i := 0; i < 200000; i++ {
		ringBell(s.ownBell)
		ringBell(c.ownBell)
	}
	buf := make([]byte, 4)
	for i := 0; i < 100; i++ {
		// The client announces a sleep each time, so each write rings its full doorbell.
		atomic.OrUint32(c.myWaiting, waitDoorbell)
		if _, err := s.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("round %d: %q %v", i, buf, err)
		}
	}
	// The server's end shut down (by a peer holding it): the client's blocked read ends.
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(buf)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	unix.Shutdown(s.ownBell, unix.SHUT_RDWR)
	select {
	case err := <-done:
		if err == nil || !(errors.Is(err, unix.ECONNRESET) || err == io.EOF) {
			t.Fatalf("read after the doorbell hung up: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read stayed blocked after the peer shut its doorbell down")
	}
}

// A peer's lingering TCP socket queued on a doorbell (before the handshake, or on a kernel
// without SO_PASSRIGHTS) never holds a drain: its last close would wait up to its linger time
// in the thread that drops it, and a drain without room for it had the kernel drop it there.
func TestLingeringGiftNeverHoldsADrain(t *testing.T) {
	watchdog(t, 90*time.Second)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	g, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.SetsockoptInt(g, unix.SOL_SOCKET, unix.SO_SNDBUF, 4096)
	if err := unix.Connect(g, &unix.SockaddrInet4{Port: l.Addr().(*net.TCPAddr).Port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	peer, err := l.Accept() // kept open, never read
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	peer.(*net.TCPConn).SetReadBuffer(4096)
	unix.SetNonblock(g, true)
	for {
		if _, err := unix.Write(g, make([]byte, 65536)); err != nil {
			break
		}
	}
	unix.SetsockoptLinger(g, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 600})
	if err := unix.Sendmsg(fds[0], []byte{1}, unix.UnixRights(g), nil, 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(g) // not the last reference: the queued message holds one
	done := make(chan bool)
	go func() {
		rung, _ := drainBell(fds[1])
		done <- rung
	}()
	select {
	case rung := <-done:
		if !rung {
			t.Fatal("the ring was not seen")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the drain waited for the gift's close")
	}
}
