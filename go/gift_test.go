package colo

import (
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// lingeringSocket is a TCP socket whose last close would wait 600 s: bytes queued that its peer
// (kept open by the returned listener's accepted connection, never read) cannot take.
func lingeringSocket(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	g, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.SetsockoptInt(g, unix.SOL_SOCKET, unix.SO_SNDBUF, 4096)
	if err := unix.Connect(g, &unix.SockaddrInet4{Port: l.Addr().(*net.TCPAddr).Port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	peer, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	peer.(*net.TCPConn).SetReadBuffer(4096)
	unix.SetNonblock(g, true)
	for {
		if _, err := unix.Write(g, make([]byte, 65536)); err != nil {
			break
		}
	}
	unix.SetsockoptLinger(g, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 600})
	return g
}

// holdingSocket is a Unix socket whose queue holds fd (closed here): only its release drops it.
func holdingSocket(t *testing.T, fd int) int {
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendmsg(p[1], []byte{1}, unix.UnixRights(fd), nil, 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(p[1])
	unix.Close(fd)
	return p[0]
}

func returnsWithin(t *testing.T, what string, f func()) {
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal(what)
	}
}

// A peer's Unix socket whose queue holds a lingering socket, at any depth, is closed at once:
// shut down and emptied, what it held disarmed.
func TestNestedGiftClosesAtOnce(t *testing.T) {
	watchdog(t, 150*time.Second)
	u := holdingSocket(t, lingeringSocket(t))
	returnsWithin(t, "the close waited for the linger one level down", func() { discardFd(u) })
	u = holdingSocket(t, lingeringSocket(t))
	for i := 0; i < 3*inlineSockets; i++ {
		u = holdingSocket(t, u)
	}
	returnsWithin(t, "the close waited for the linger at a chain's bottom", func() { discardFd(u) })
}

// The sender of a lingering socket keeps its own reference, turns lingering back on after our
// disarm and closes its reference: ours is then the last, and its close must not wait.
func TestGiftArmedAgainClosesAtOnce(t *testing.T) {
	watchdog(t, 90*time.Second)
	g := lingeringSocket(t)
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if err := unix.Sendmsg(p[1], []byte{1}, unix.UnixRights(g), nil, 0); err != nil {
		t.Fatal(err)
	}
	oob := make([]byte, rightsOOB)
	_, oobn, _, _, err := unix.Recvmsg(p[0], make([]byte, 8), oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	fds := parseRights(oob[:oobn])
	unix.SetsockoptLinger(g, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 600})
	// The sender's close, on a goroutine: once our hand-off's thread has ended it is the last
	// and waits out the linger (the sender's cost, as it should be). Ours comes after its
	// descriptor is gone (a number the runtime may reuse: then after a bounded wait).
	go unix.Close(g)
	for until := time.Now().Add(5 * time.Second); time.Now().Before(until); time.Sleep(time.Millisecond) {
		if _, err := unix.FcntlInt(uintptr(g), unix.F_GETFD, 0); err != nil {
			break
		}
	}
	// A plain close, as the last of any path that holds it would be.
	returnsWithin(t, "our close waited for the linger its sender set again", func() { unix.Close(fds[0]) })
	// No thread kept a table of its own: /proc/self (the main thread's) sees a new descriptor.
	for i := 0; i < 20; i++ {
		disarm(lingeringSocket(t))
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)); err != nil {
		t.Fatalf("/proc/self does not see our new descriptor: %v", err)
	}
}
