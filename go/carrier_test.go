package colo

import (
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/nettest"
)

func TestCarrier(t *testing.T) {
	watchdog(t, 60*time.Second)
	l := listen(t)
	c, s := pair(t, l, &Dialer{forceCarrier: true})
	defer c.Close()
	defer s.Close()
	if c.Transport() != TransportColo || s.Transport() != TransportColo || c.carrier == nil || s.carrier == nil {
		t.Fatalf("transport %v/%v carrier %v/%v", c.Transport(), s.Transport(), c.carrier != nil, s.carrier != nil)
	}
	// The 4-tuple is the carrier's.
	if c.LocalAddr().String() != s.RemoteAddr().String() || c.RemoteAddr().String() != s.LocalAddr().String() {
		t.Fatalf("addresses: client %v->%v server %v<-%v", c.LocalAddr(), c.RemoteAddr(), s.LocalAddr(), s.RemoteAddr())
	}
	if c.LocalAddr().(*net.TCPAddr).Port == 0 {
		t.Fatal("carrier client port 0")
	}
	go func() { io.Copy(s, s); s.CloseWrite() }()
	c.Write([]byte("through the segment"))
	c.CloseWrite()
	b, err := io.ReadAll(c)
	if err != nil || string(b) != "through the segment" {
		t.Fatalf("got %q %v", b, err)
	}
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		c, s := pair(t, l, &Dialer{forceCarrier: true})
		if c.Transport() != TransportColo {
			t.Fatal("carrier fell back")
		}
		return c, s, func() { c.Close(); s.Close() }, nil
	})
}

func TestNeedCarrierRetry(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	l.carrierOnly.Store(true)
	shortRule(t, false, plainFor) // twenty one-request connections: the retry, not the rule, is tested
	for i := 0; i < 20; i++ {
		c, s := pair(t, l, nil)
		if c.Transport() != TransportColo || c.carrier == nil {
			t.Fatalf("transport %v, carrier %v", c.Transport(), c.carrier != nil)
		}
		c.Write([]byte("x"))
		b := make([]byte, 1)
		if _, err := io.ReadFull(s, b); err != nil {
			t.Fatal(err)
		}
		c.Close()
		s.Close()
	}
}

// A plain TCP client from this host next to pending colo offers still gets plain TCP.
func TestCarrierPlainLocalClient(t *testing.T) {
	watchdog(t, 30*time.Second)
	l := listen(t)
	go func() {
		c, err := net.Dial("tcp", l.Addr().String())
		if err == nil {
			c.Write([]byte("plain"))
			c.Close()
		}
	}()
	s, err := l.AcceptColo()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Transport() != TransportTCP {
		t.Fatal("plain client got colo")
	}
	b, _ := io.ReadAll(s)
	if string(b) != "plain" {
		t.Fatalf("got %q", b)
	}
}
