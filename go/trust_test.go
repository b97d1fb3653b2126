package colo

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// root (0) on 127.0.0.1:6391 and 0.0.0.0:7000, nobody (65534) on 127.0.0.2:6391 (a decoy,
// listed first), 0.0.0.0:7001 and a connection 127.0.0.1:40001 -> 127.0.0.1:7000; one garbled
// line.
const procTCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0200007F:18F7 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 1001 1 0000000000000000 100 0 0 10 0
   1: 0100007F:18F7 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1002 1 0000000000000000 100 0 0 10 0
   2: 00000000:1B58 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1003 1 0000000000000000 100 0 0 10 0
   3: 00000000:1B59 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 1004 1 0000000000000000 100 0 0 10 0
   4: 0100007F:9C41 0100007F:1B58 01 00000000:00000000 00:00000000 00000000 65534        0 1005 1 0000000000000000 20 4 0 10 -1
   5: garbage
`

// root on [::]:7002 and [::1]:7003, nobody on [::]:6391, uid 1000 on [::ffff:127.0.0.3]:7004.
const procTCP6 = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1B5A 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2001 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:1B5B 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2002 1 0000000000000000 100 0 0 10 0
   2: 00000000000000000000000000000000:18F7 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 2003 1 0000000000000000 100 0 0 10 0
   3: 0000000000000000FFFF00000300007F:1B5C 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 2004 1 0000000000000000 100 0 0 10 0
`

func procTable() []tcpSocket {
	return append(parseTCPTable(strings.NewReader(procTCP)), parseTCPTable(strings.NewReader(procTCP6))...)
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func TestTCPTableParses(t *testing.T) {
	tb := procTable()
	if len(tb) != 9 {
		t.Fatalf("%d sockets, want 9 (the garbled line skipped)", len(tb))
	}
	if tb[0].local != ap("127.0.0.2:6391") || !tb[0].listening || tb[0].uid != 65534 {
		t.Fatalf("first: %+v", tb[0])
	}
	if tb[4].local != ap("127.0.0.1:40001") || tb[4].remote != ap("127.0.0.1:7000") || tb[4].listening {
		t.Fatalf("connection: %+v", tb[4])
	}
	if tb[6].local != ap("[::1]:7003") || tb[8].local != ap("127.0.0.3:7004") {
		t.Fatalf("IPv6: %+v %+v", tb[6], tb[8])
	}
}

func TestKernelListenerOrder(t *testing.T) {
	tb := procTable()
	for _, c := range []struct {
		dialed, want string
		uid          uint32
	}{
		{"127.0.0.1:6391", "127.0.0.1:6391", 0}, // not the decoy listed first, nor nobody's [::]
		{"[::ffff:127.0.0.1]:6391", "127.0.0.1:6391", 0},
		{"127.0.0.2:6391", "127.0.0.2:6391", 65534},
		{"127.0.0.9:6391", "[::]:6391", 65534},
		{"[::1]:6391", "[::]:6391", 65534},
		{"127.0.0.1:7000", "0.0.0.0:7000", 0},
		{"10.1.2.3:7001", "0.0.0.0:7001", 65534},
		{"127.0.0.1:7002", "[::]:7002", 0},
		{"[::1]:7003", "[::1]:7003", 0},
		{"127.0.0.3:7004", "127.0.0.3:7004", 1000},
		{"0.0.0.0:6391", "127.0.0.1:6391", 0},
		{"[::1]:7000", "", 0},
		{"127.0.0.1:7003", "", 0},
	} {
		addr, uid, uidOK, ok := kernelListener(ap(c.dialed), tb)
		if c.want == "" {
			if ok {
				t.Errorf("%s: listener %v, want none", c.dialed, addr)
			}
			continue
		}
		if !ok || !uidOK || addr != ap(c.want) || uid != c.uid {
			t.Errorf("%s: %v uid %d (%v %v), want %s uid %d", c.dialed, addr, uid, uidOK, ok, c.want, c.uid)
		}
	}
	tb = append(tb, tcpSocket{local: ap("127.0.0.1:6391"), listening: true, uid: 7})
	if _, _, uidOK, ok := kernelListener(ap("127.0.0.1:6391"), tb); !ok || uidOK {
		t.Errorf("listeners of several uids at one address: uidOK %v", uidOK)
	}
}

// unboundTable is procTable's sockets as sock_diag reports them: bound to no device.
func unboundTable() []tcpSocket {
	tb := procTable()
	for i := range tb {
		tb[i].unbound = true
	}
	return tb
}

func TestRendezvousCheck(t *testing.T) {
	tb := unboundTable()
	for _, c := range []struct {
		dialed, reached string
		ok              bool
	}{
		{"127.0.0.1:6391", "colo/1/127.0.0.1:6391", false}, // a squatted exact name beside a decoy listener
		{"127.0.0.1:6391", "colo/1/0.0.0.0:6391", false},
		{"127.0.0.1:7000", "colo/1/127.0.0.1:7000", false},
		{"127.0.0.1:7000", "colo/1/0.0.0.0:7000", false},
		{"127.0.0.1:9", "colo/1/127.0.0.1:9", false},
		{"127.0.0.2:6391", "colo/1/127.0.0.2:6391", true},
		{"127.0.0.1:7001", "colo/1/0.0.0.0:7001", true},
		{"127.0.0.1:7001", "colo/1/127.0.0.1:7001", false},
		// An IPv4 dial only nobody's IPv6 wildcard would take: it may be IPV6_V6ONLY (TCP
		// refused), which the table does not show.
		{"127.0.0.9:6391", "colo/1/[::]:6391", false},
		{"[::1]:6391", "colo/1/[::]:6391", true},
	} {
		if err := checkRendezvous(ap(c.dialed), c.reached, 65534, tb); (err == nil) != c.ok {
			t.Errorf("%s via %s: %v, want ok=%v", c.dialed, c.reached, err, c.ok)
		}
	}
	// The exact name of an address a wildcard serves: the wildcard's own name comes next in
	// the lookup, to be tried instead; none for the right name of the wrong uid.
	names := []string{"colo/1/127.0.0.1:7000", "colo/1/0.0.0.0:7000", "colo/1/[::]:7000"}
	err := checkRendezvous(ap("127.0.0.1:7000"), names[0], 65534, tb)
	if got := laterOwnName(err, names, names[0]); got != names[1] {
		t.Errorf("exact name before a wildcard: next %q (%v), want %q", got, err, names[1])
	}
	err = checkRendezvous(ap("127.0.0.1:7000"), names[1], 65534, tb)
	if got := laterOwnName(err, names, names[1]); got != "" {
		t.Errorf("the wildcard's name of the wrong uid: next %q, want none", got)
	}
	// Where the kernel says that wildcard is not IPV6_V6ONLY (sock_diag), it takes the IPv4 dial.
	for i := range tb {
		if tb[i].local.Addr().Is6() {
			tb[i].takesV4 = true
		}
	}
	if err := checkRendezvous(ap("127.0.0.9:6391"), "colo/1/[::]:6391", 65534, tb); err != nil {
		t.Errorf("a dual-stack wildcard: %v", err)
	}
}

// The kernel's sock_diag says which IPv6 listeners are IPV6_V6ONLY.
func TestDiagSaysWhichListenersAreV6Only(t *testing.T) {
	listen := func(v6only int) (int, uint16) {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, v6only); err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet6{}); err != nil {
			t.Fatal(err)
		}
		if err := unix.Listen(fd, 1); err != nil {
			t.Fatal(err)
		}
		sa, _ := unix.Getsockname(fd)
		return fd, uint16(sa.(*unix.SockaddrInet6).Port)
	}
	only, onlyPort := listen(1)
	defer unix.Close(only)
	dual, dualPort := listen(0)
	defer unix.Close(dual)
	socks, err := diagListeners()
	if err != nil {
		t.Skip("sock_diag refused:", err)
	}
	seen := 0
	for _, s := range socks {
		switch s.local.Port() {
		case onlyPort:
			seen++
			if s.takesV4 {
				t.Error("an IPV6_V6ONLY listener said to take IPv4")
			}
		case dualPort:
			seen++
			if !s.takesV4 {
				t.Error("a dual-stack listener said not to take IPv4")
			}
		}
	}
	if seen != 2 {
		t.Errorf("sock_diag listed %d of the 2 listeners", seen)
	}
}

// A listener bound to a device, or one the table does not say is unbound (/proc/net/tcp),
// proves nothing for a rendezvous of another uid.
func TestRendezvousOfADeviceBoundListener(t *testing.T) {
	tb := unboundTable()
	if err := checkRendezvous(ap("127.0.0.2:6391"), "colo/1/127.0.0.2:6391", 65534, tb); err != nil {
		t.Fatalf("unbound: %v", err)
	}
	for i := range tb {
		if tb[i].local == ap("127.0.0.2:6391") {
			tb[i].unbound = false
		}
	}
	if err := checkRendezvous(ap("127.0.0.2:6391"), "colo/1/127.0.0.2:6391", 65534, tb); err == nil {
		t.Error("a listener bound to a device (or not known to be unbound) was proof")
	}
	if err := checkRendezvous(ap("127.0.0.2:6391"), "colo/1/127.0.0.2:6391", 65534, procTable()); err == nil {
		t.Error("/proc/net/tcp's table, which does not show devices, was proof")
	}
}

// sock_diag reports a listener's bound device.
func TestDiagShowsBoundDevice(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	want := canonical(netip.MustParseAddrPort(l.Addr().String()))
	socks, err := diagListeners()
	if err != nil {
		t.Skipf("sock_diag refused: %v", err)
	}
	found := false
	for _, s := range socks {
		if s.local == want {
			found = true
			if !s.unbound {
				t.Errorf("%v reported bound to a device", want)
			}
		}
	}
	if !found {
		t.Fatalf("%v not listed", want)
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), "lo") })
		return errors.Join(err, serr)
	}}
	b, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Skipf("SO_BINDTODEVICE refused: %v", err)
	}
	defer b.Close()
	bound := canonical(netip.MustParseAddrPort(b.Addr().String()))
	socks, _ = diagListeners()
	for _, s := range socks {
		if s.local == bound && s.unbound {
			t.Errorf("%v bound to lo reported unbound", bound)
		}
	}
}

func TestTCPOwner(t *testing.T) {
	tb := procTable()
	if uid, ok := tcpOwner(ap("127.0.0.1:40001"), ap("127.0.0.1:7000"), tb); !ok || uid != 65534 {
		t.Errorf("owner %d %v", uid, ok)
	}
	if _, ok := tcpOwner(ap("127.0.0.1:7000"), ap("127.0.0.1:40001"), tb); ok {
		t.Error("the other end found")
	}
	if _, ok := tcpOwner(ap("0.0.0.0:7000"), ap("0.0.0.0:0"), tb); ok {
		t.Error("a listener is no connection")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	uid, ok := tcpOwner(c.LocalAddr().(*net.TCPAddr).AddrPort(), l.Addr().(*net.TCPAddr).AddrPort(), tcpSockets())
	if !ok || uid != uint32(os.Getuid()) {
		t.Errorf("this host's own connection: uid %d %v", uid, ok)
	}
}

func TestServes(t *testing.T) {
	any6 := ap("[::]:80")
	for _, c := range []struct {
		listen netip.AddrPort
		v6only bool
		dialed string
		serves bool
	}{
		{any6, false, "127.0.0.1:80", true},
		{any6, true, "127.0.0.1:80", false},
		{any6, true, "[::ffff:127.0.0.1]:80", false},
		{any6, true, "[::1]:80", true},
		{any6, false, "[::1]:81", false},
		{ap("0.0.0.0:80"), false, "10.0.0.1:80", true},
		{ap("0.0.0.0:80"), false, "[::1]:80", false},
		{ap("127.0.0.1:80"), false, "127.0.0.2:80", false},
	} {
		if got := serves(c.listen, c.v6only, ap(c.dialed)); got != c.serves {
			t.Errorf("%v (v6only %v) for %s: %v", c.listen, c.v6only, c.dialed, got)
		}
	}
	if !serves(any6, false, netip.AddrPort{}) || serves(any6, true, netip.AddrPort{}) {
		t.Error("no dialed address")
	}
}

// A listener on [::] with IPV6_V6ONLY (Go sets it for "tcp6") refuses TCP to 127.0.0.1; a colo
// client that reaches its rendezvous through the dual-stack fallback is refused the same way
// (REJECT(NOT_SERVED)), and an IPv6 client still gets shared memory.
func TestV6onlyListenerRefusesIPv4(t *testing.T) {
	l, err := ListenColo("tcp6", "[::]:0")
	if err != nil {
		t.Fatalf("listen on [::]: %v (the test needs IPv6 loopback)", err)
	}
	defer l.Close()
	if !l.v6only {
		t.Fatal("a tcp6 listener on [::] is IPV6_V6ONLY")
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	// First an IPv6 client, welcomed: the listener (colo/1/[::]:port) is then known to answer,
	// which must not let an IPv4 client skip waiting for its answer.
	c, err := Dial("tcp", net.JoinHostPort("::1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Transport() != TransportColo {
		t.Fatalf("IPv6 client: %v, want shared memory", c.Transport())
	}
	if _, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("plain TCP to 127.0.0.1: %v, want ECONNREFUSED", err)
	}
	for i := 0; i < 2; i++ {
		if _, err := Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("colo to 127.0.0.1, dial %d: %v, want ECONNREFUSED", i, err)
		}
	}
}

// A REJECT with a reason the client does not know is a refusal like any other: the client dials
// plain TCP (spec section 3).
func TestUnknownRejectReasonDialsTCP(t *testing.T) {
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := tl.Addr().(*net.TCPAddr).AddrPort()
	rv, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: "@" + rendezvousName(addr), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer rv.Close()
	go func() {
		for {
			c, err := rv.AcceptUnix()
			if err != nil {
				return
			}
			buf, oob := make([]byte, 64), make([]byte, 256)
			_, oobn, _, _, _ := c.ReadMsgUnix(buf, oob)
			closeRights(oob[:oobn])
			c.Write(hsMsg{Type: MsgReject, Version: Version, Arg: 99}.encode())
			c.Close()
		}
	}()
	// An earlier test of this process may have had a colo listener on the same port: its
	// WELCOME, remembered by name and pid (this process's, as this fake's), would let the dial
	// go on without waiting for the answer.
	welcomed.Delete(rendezvousName(addr))
	c, err := Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Transport() != TransportTCP {
		t.Fatalf("transport %v after REJECT(99), want TCP", c.Transport())
	}
}

func TestDiagFindsListenersAndConnections(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := l.Addr().(*net.TCPAddr).AddrPort()
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	uid := uint32(os.Getuid())
	ls, err := diagListeners()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range ls {
		found = found || (s.listening && s.local == addr && s.uid == uid)
	}
	if !found {
		t.Fatalf("listener %v not among %v", addr, ls)
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if s, ok, err := diagConnection(local, addr); err != nil || !ok || s.uid != uid || s.local != local || s.remote != addr {
		t.Fatalf("client end: %+v %v %v", s, ok, err)
	}
	if _, ok, err := diagConnection(ap("127.0.0.1:1"), addr); err != nil || ok {
		t.Fatalf("no such connection: %v %v", ok, err)
	}
	if _, ok, _ := diagConnection(addr, ap("127.0.0.9:5")); ok {
		t.Fatal("the listener the lookup falls back to counted as a connection")
	}
}
