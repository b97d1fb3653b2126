package colo

import (
	"io"
	"net"
	"strconv"
	"testing"
	"time"
)

// Lookup order of spec section 2: a client dialing 127.0.0.1 reaches a listener on the IPv4
// wildcard and one on the IPv6 wildcard (dual stack); ::1 reaches [::1] and [::].
func TestLookupWildcards(t *testing.T) {
	watchdog(t, 30*time.Second)
	cases := []struct{ listen, dialHost string }{
		{"0.0.0.0:0", "127.0.0.1"},
		{"[::]:0", "127.0.0.1"},
		{"[::1]:0", "::1"},
		{"[::]:0", "::1"},
		{"127.0.0.1:0", "localhost"},
	}
	for _, tc := range cases {
		l, err := ListenColo("tcp", tc.listen)
		if err != nil {
			t.Logf("%s: %v (skipped)", tc.listen, err)
			continue
		}
		port := l.Addr().(*net.TCPAddr).Port
		addr := net.JoinHostPort(tc.dialHost, strconv.Itoa(port))
		go func() {
			s, err := l.AcceptColo()
			if err == nil {
				io.Copy(s, s)
				s.Close()
			}
		}()
		c, err := Dial("tcp", addr)
		if err != nil {
			t.Errorf("listen %s, dial %s: %v", tc.listen, addr, err)
			l.Close()
			continue
		}
		if c.Transport() != TransportColo {
			t.Errorf("listen %s, dial %s: transport %v", tc.listen, addr, c.Transport())
		}
		c.Write([]byte("x"))
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil {
			t.Errorf("listen %s, dial %s: %v", tc.listen, addr, err)
		}
		c.Close()
		l.Close()
	}
}

// A rendezvous name held by someone else (here: a listener whose TCP socket was closed): a new
// listener on the same address serves TCP only.
func TestRendezvousNameTaken(t *testing.T) {
	watchdog(t, 30*time.Second)
	l1 := listen(t)
	port := l1.Addr().(*net.TCPAddr).Port
	l1.tcp.Close()
	l2, err := ListenColo("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Skipf("port reuse: %v", err)
	}
	defer l2.Close()
	if l2.Colo() {
		t.Fatal("second listener claims the rendezvous name")
	}
}
