package colo

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// netnsTestListener is a listener of "another namespace" for netnsClaim (without a rendezvous
// socket: an offer can never come, so every connection ends plain), and the boot id it answers.
func netnsTestListener(t *testing.T) (*Listener, []byte) {
	t.Helper()
	boot, err := bootID()
	if err != nil {
		t.Skip("no boot id")
	}
	return &Listener{netns: &netnsServer{name: "colo-1-1", boot: boot, pending: map[[24]byte]chan *offer{}, live: -1}}, boot
}

// tcpPair is a connected pair of loopback TCP sockets (client, server), closed at the test's end.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// lateNetnsConn dials, as a client configured for another namespace, a colo server of that
// namespace (the Go listener's netnsClaim, on a listener of this one) whose program accepts late
// after the dial: answers the PROPOSAL then, writes banner, and echoes until the client's end.
func lateNetnsConn(t *testing.T, late time.Duration, banner string) *Conn {
	t.Helper()
	l, _ := netnsTestListener(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		time.Sleep(late)
		s, err := ln.Accept()
		if err != nil {
			return
		}
		tc := s.(*net.TCPConn)
		defer tc.Close()
		if l.netnsClaim(tc) == nil { // no rendezvous here: always plain
			tc.Write([]byte(banner))
			<-echoServer(&Conn{tcp: tc})
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := netnsDial(ctx, "tcp", ln.Addr().(*net.TCPAddr).AddrPort(), t.TempDir(), DefaultGeometry)
	if err != nil {
		t.Fatalf("dial to a server whose program accepts %v late: %v", late, err)
	}
	t.Cleanup(func() { c.Close() })
	if c.Transport() != TransportTCP {
		t.Fatalf("transport %v", c.Transport())
	}
	return c
}

// A server whose program accepts after the client stopped waiting for the answer to its
// PROPOSAL: the dial succeeds over plain TCP and the answer, when it comes (DECLINE behind the
// client's bytes, ACCEPT before a banner), never reaches the application; a read deadline ends
// the wait for it as for bytes. 2.5 s: past the answer wait, and past the 2 s this dial waited
// when it failed such a connection.
func TestNetnsLateAccept(t *testing.T) {
	watchdog(t, 60*time.Second)
	const late = 2500 * time.Millisecond
	const banner = "220 late server ready\r\n"
	data := make([]byte, 100<<10)
	for i := range data {
		data[i] = recyclePattern(1, i)
	}
	readBanner := func(t *testing.T, c *Conn) {
		b := make([]byte, len(banner))
		if _, err := io.ReadFull(c, b); err != nil || string(b) != banner {
			t.Fatalf("banner %q %v", b, err)
		}
	}
	t.Run("ClientFirst", func(t *testing.T) {
		t.Parallel()
		if back := roundTrip(t, lateNetnsConn(t, late, ""), data); !bytes.Equal(back, data) {
			t.Fatalf("echo of %d bytes: %d bytes back, intact %v", len(data), len(back), bytes.Equal(back, data[:min(len(back), len(data))]))
		}
	})
	t.Run("ServerFirst", func(t *testing.T) {
		t.Parallel()
		c := lateNetnsConn(t, late, banner)
		readBanner(t, c)
		if back := roundTrip(t, c, data[:10]); !bytes.Equal(back, data[:10]) {
			t.Fatalf("echo %q", back)
		}
	})
	t.Run("ReadDeadline", func(t *testing.T) {
		t.Parallel()
		c := lateNetnsConn(t, late, banner)
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, err := c.Read(make([]byte, 64)); !errors.Is(err, os.ErrDeadlineExceeded) || !isTimeout(err) {
			t.Fatalf("read before the late answer, deadline passed: %d %v", n, err)
		}
		c.SetReadDeadline(time.Time{})
		readBanner(t, c)
		if back := roundTrip(t, c, data); !bytes.Equal(back, data) {
			t.Fatalf("echo after the deadline: %d bytes back", len(back))
		}
	})
}

// What Read takes off the head of a stream that owes its answer: a whole answer (and only it),
// nothing of bytes that are not one or of part of one that never grows, and nothing at the end.
func TestNetnsOwedHead(t *testing.T) {
	watchdog(t, 60*time.Second)
	answer := append(append([]byte{}, netnsMagic...), make([]byte, netnsAnswerLen-8)...)
	answer[8] = netnsDecline
	for _, tc := range []struct {
		sent, want string
		end        bool // the server ends its stream after sent
	}{
		{string(answer) + "after", "after", false},
		{"+OK not colo", "+OK not colo", false},
		{string(answer[:50]), string(answer[:50]), false}, // never grows: not an answer
		{string(answer[:50]), string(answer[:50]), true},
		{"", "", true},
	} {
		cc, s := tcpPair(t)
		c := &Conn{tcp: cc}
		c.owed.Store(true)
		s.Write([]byte(tc.sent))
		got, err := make([]byte, len(tc.want)), error(nil)
		if tc.end {
			s.Close()
			got, err = io.ReadAll(c)
		} else {
			_, err = io.ReadFull(c, got)
		}
		if err != nil || string(got) != tc.want || c.owed.Load() {
			t.Fatalf("sent %q: read %q %v, want %q; owed %v", tc.sent, got, err, tc.want, c.owed.Load())
		}
	}
}
