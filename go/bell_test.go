package colo

import (
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// blockingFd clears O_NONBLOCK: ringing and draining must not depend on it.
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

// seqpacketPair is a connected pair of control sockets.
func seqpacketPair(t *testing.T) (int, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fds[0], fds[1]
}

// Ringing and draining a control socket never block, however full its queue (and whatever its
// O_NONBLOCK); what a receive gets is sorted as spec section 6 says: a one-byte datagram is a
// ring, a 16-byte one a message, an empty one or the peer's end the hang-up, anything else
// (another length, descriptors) garbage; descriptors sent along are never kept.
func TestCtlRingAndReceiveNeverBlock(t *testing.T) {
	watchdog(t, 30*time.Second)
	a, b := seqpacketPair(t)
	defer unix.Close(a)
	for i := 0; i < 200000; i++ { // far more than the queue holds: the rest fail with EAGAIN
		ringBell(a)
	}
	var m [msgSize]byte
	rings := 0
	for {
		got := recvCtl(b, &m)
		if got == gotNothing {
			break
		}
		if got != gotRing {
			t.Fatalf("a full queue of rings gave %d", got)
		}
		if rings++; rings > 200000 {
			t.Fatal("the receives never emptied the queue")
		}
	}
	if rings == 0 {
		t.Fatal("no ring received")
	}
	if got := recvCtl(b, &m); got != gotNothing {
		t.Fatalf("an empty queue gave %d", got)
	}
	efd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
	defer unix.Close(efd)
	if refuseRights(b) {
		if err := unix.Sendmsg(a, []byte{1}, unix.UnixRights(efd), nil, 0); err != unix.EPERM {
			t.Fatalf("a descriptor sent to a control socket that refuses them: %v", err)
		}
		unix.SetsockoptInt(b, unix.SOL_SOCKET, soPassRights, 1) // as a kernel before 6.16
	}
	before := openFds(t)
	welcome := hsMsg{Type: MsgWelcome, Version: Version}.encode()
	for _, tc := range []struct {
		name string
		send func() error
		want int
	}{
		{"a ring", func() error { return unix.Sendmsg(a, []byte{7}, nil, nil, 0) }, gotRing},
		{"a message", func() error { return unix.Sendmsg(a, welcome, nil, nil, 0) }, gotMsg},
		{"five bytes", func() error { return unix.Sendmsg(a, []byte("abcde"), nil, nil, 0) }, gotGarbage},
		{"seventeen bytes", func() error { return unix.Sendmsg(a, append(welcome, 0), nil, nil, 0) }, gotGarbage},
		{"a ring with a descriptor", func() error { return unix.Sendmsg(a, []byte{1}, unix.UnixRights(efd), nil, 0) }, gotGarbage},
		{"a descriptor alone", func() error { return sendRights(a, unix.UnixRights(efd)) }, gotGarbage},
		{"an empty datagram", func() error { return unix.Sendmsg(a, nil, nil, nil, 0) }, gotHangUp},
	} {
		if err := tc.send(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := recvCtl(b, &m); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
		if tc.want == gotMsg && string(m[:]) != string(welcome) {
			t.Errorf("the message read as %x", m)
		}
	}
	if n := openFds(t); n != before {
		t.Fatalf("receiving installed %d descriptors", n-before)
	}
	// The peer shuts its end down: a ring, then the hang-up.
	ringBell(a)
	unix.Shutdown(a, unix.SHUT_WR)
	if got := recvCtl(b, &m); got != gotRing {
		t.Fatalf("the ring before the hang-up: %d", got)
	}
	if got := recvCtl(b, &m); got != gotHangUp {
		t.Fatalf("after the peer's shutdown: %d", got)
	}
	// Ringing a peer that is gone raises no SIGPIPE.
	unix.Close(b)
	ringBell(a)
}

// A control socket that refuses descriptors is drained in one system call (recvmmsg), each
// datagram sorted as one received alone would be, a full queue of rings never blocking it.
func TestCtlBatchReceive(t *testing.T) {
	watchdog(t, 30*time.Second)
	a, b := seqpacketPair(t)
	defer unix.Close(a)
	defer unix.Close(b)
	if !refuseRights(b) {
		t.Skip("a kernel before 6.16: no SO_PASSRIGHTS, no batch receive")
	}
	blockingFd(t, b)
	for i := 0; i < 200000; i++ {
		ringBell(a)
	}
	var batch ctlBatch
	rings := 0
	for {
		n, e := recvCtlBatch(b, &batch)
		if e == unix.EAGAIN {
			break
		}
		if e != 0 || n < 1 || n > ctlDrainCalls {
			t.Fatalf("a batch of rings: %d, %v", n, e)
		}
		for i := 0; i < n; i++ {
			if k := ctlKind(int(batch.hdrs[i].n), batch.hdrs[i].hdr.Flags, false); k != gotRing {
				t.Fatalf("a ring read as %d", k)
			}
		}
		if rings += n; rings > 200000 {
			t.Fatal("the receives never emptied the queue")
		}
	}
	welcome := hsMsg{Type: MsgWelcome, Version: Version}.encode()
	for _, d := range [][]byte{{1}, []byte("abcde"), welcome, append(welcome, 0), nil} {
		if err := unix.Sendmsg(a, d, nil, nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	n, e := recvCtlBatch(b, &batch)
	if e != 0 || n != 5 {
		t.Fatalf("a batch of five: %d, %v", n, e)
	}
	want := []int{gotRing, gotGarbage, gotMsg, gotGarbage, gotHangUp}
	for i, w := range want {
		if k := ctlKind(int(batch.hdrs[i].n), batch.hdrs[i].hdr.Flags, false); k != w {
			t.Errorf("datagram %d: %d, want %d", i, k, w)
		}
	}
	if string(batch.bufs[2][:msgSize]) != string(welcome) {
		t.Errorf("the message read as %x", batch.bufs[2])
	}
	// A ring, then the peer's end shut down.
	ringBell(a)
	unix.Shutdown(a, unix.SHUT_WR)
	n, e = recvCtlBatch(b, &batch)
	if e != 0 || n < 2 {
		t.Fatalf("a ring and the hang-up: %d, %v", n, e)
	}
	for i, w := range []int{gotRing, gotHangUp} {
		if k := ctlKind(int(batch.hdrs[i].n), batch.hdrs[i].hdr.Flags, false); k != w {
			t.Errorf("after the shutdown, datagram %d: %d, want %d", i, k, w)
		}
	}
}

// A peer that floods our control socket with rings cannot block or hang us: rings into its full
// queue return at once, a connection whose peer floods it goes on, and a blocked read still
// ends at the flooder's hang-up.
func TestPeerFloodingRings(t *testing.T) {
	watchdog(t, 60*time.Second)
	l := listen(t)
	c, s := pair(t, l, &Dialer{})
	defer c.Close()
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the server's process floods the client
		defer wg.Done()
		for !stop.Load() {
			ringBell(s.ctlFd)
		}
	}()
	buf := make([]byte, 4)
	for i := 0; i < 200; i++ {
		go func() { s.Write([]byte("ping")) }()
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("round %d: %q %v", i, buf, err)
		}
		if _, err := c.Write([]byte("pong")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "pong" {
			t.Fatalf("round %d: %q %v", i, buf, err)
		}
	}
	// A blocked read ends when the flooder closes, its FIN behind a full queue of rings.
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(buf)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the read block (it ends either way)
	stop.Store(true)
	wg.Wait()
	for i := 0; i < 100000; i++ { // fill the client's queue
		ringBell(s.ctlFd)
	}
	s.Close()
	if err := <-done; err != io.EOF {
		t.Fatalf("read after the flooder closed: %v, want EOF", err)
	}
}

// A peer's lingering TCP socket queued on our control socket (on a kernel without SO_PASSRIGHTS)
// never holds a receive, nor the close of the socket: its last close would wait up to its
// linger time in the thread that drops it, and a receive without room for it had the kernel
// drop it there.
func TestLingeringGiftNeverHoldsAReceive(t *testing.T) {
	watchdog(t, 150*time.Second)
	a, b := seqpacketPair(t)
	defer unix.Close(a)
	unix.SetsockoptInt(b, unix.SOL_SOCKET, soPassRights, 1)
	g := lingeringSocket(t)
	if err := unix.Sendmsg(a, []byte{1}, unix.UnixRights(g), nil, 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(g) // not the last reference: the queued message holds one
	returnsWithin(t, "the receive waited for the gift's close", func() {
		var m [msgSize]byte
		if got := recvCtl(b, &m); got != gotGarbage {
			t.Errorf("a ring with a descriptor: %d", got)
		}
	})
	u := holdingSocket(t, lingeringSocket(t))
	if err := unix.Sendmsg(a, []byte{1}, unix.UnixRights(u), nil, 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(u)
	returnsWithin(t, "the close waited for the gift queued on the control socket", func() {
		emptyCtlBeforeClose(b)
		if err := unix.Sendmsg(a, []byte{1}, unix.UnixRights(a), nil, unix.MSG_NOSIGNAL); !errors.Is(err, unix.EPIPE) {
			t.Errorf("the socket still took descriptors after it was emptied: %v", err)
		}
		unix.Close(b)
	})
}
