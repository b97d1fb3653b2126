package colo

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultGeometry is the segment shape a Dialer offers when its Geometry is zero: a 256 KiB byte
// ring and 16 message slots of 64 KiB in each direction. Memory is touched lazily.
var DefaultGeometry = Geometry{RingCapacity: 256 << 10, SlotSize: 64 << 10, SlotCount: 16}

// handshakeTimeout bounds the wait for WELCOME when the context has no deadline.
const handshakeTimeout = 5 * time.Second

var debug = os.Getenv("COLO_DEBUG") != ""

func logf(format string, args ...any) {
	if debug {
		log.Printf("colo: "+format, args...)
	}
}

// A Dialer holds options for connecting. The zero value is ready to use.
type Dialer struct {
	// Timeout bounds the whole dial (rendezvous, handshake and any TCP fallback). Zero: none.
	Timeout time.Duration
	// Geometry of the segment offered to the server; zero means DefaultGeometry.
	Geometry Geometry
	// TCPOnly disables colo: the Dialer always dials plain TCP.
	TCPOnly bool
}

// Dial connects to address ("host:port") on network "tcp", "tcp4" or "tcp6". A server on this
// host that speaks colo gets a shared-memory connection; anything else gets plain TCP.
func Dial(network, address string) (*Conn, error) {
	var d Dialer
	return d.DialContext(context.Background(), network, address)
}

// DialContext is Dial with a context: cancelling it aborts the dial.
func DialContext(ctx context.Context, network, address string) (*Conn, error) {
	var d Dialer
	return d.DialContext(ctx, network, address)
}

// Dial connects to address; see the package function Dial.
func (d *Dialer) Dial(network, address string) (*Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// DialContext connects to address using the context; see the package function Dial.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (*Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, &net.OpError{Op: "dial", Net: network, Err: net.UnknownNetworkError(network)}
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	if !d.TCPOnly {
		for _, ap := range localCandidates(ctx, network, address) {
			c, err := d.dialColo(ctx, ap)
			if err == nil {
				return c, nil
			}
			if ctx.Err() != nil {
				return nil, &net.OpError{Op: "dial", Net: network, Err: ctx.Err()}
			}
			logf("dial %v: %v; trying next/TCP", ap, err)
		}
	}
	var nd net.Dialer
	tc, err := nd.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return &Conn{tcp: tc.(*net.TCPConn)}, nil
}

// localCandidates resolves address and returns the addresses on this host, in order.
func localCandidates(ctx context.Context, network, address string) []netip.AddrPort {
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return nil
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		p, err := net.DefaultResolver.LookupPort(ctx, network, portStr)
		if err != nil {
			return nil
		}
		port = uint64(p)
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else {
		if host == "" {
			host = "localhost"
		}
		ipnet := "ip"
		switch network {
		case "tcp4":
			ipnet = "ip4"
		case "tcp6":
			ipnet = "ip6"
		}
		ips, _ = net.DefaultResolver.LookupNetIP(ctx, ipnet, host)
	}
	var out []netip.AddrPort
	for _, ip := range ips {
		ip = ip.Unmap()
		if (network == "tcp4" && !ip.Is4()) || (network == "tcp6" && ip.Is4()) {
			continue
		}
		if isLocal(ip) {
			out = append(out, netip.AddrPortFrom(ip, uint16(port)))
		}
	}
	return out
}

var localAddrs struct {
	sync.Mutex
	when time.Time
	set  map[netip.Addr]bool
}

// isLocal reports whether ip is loopback or an address of a local interface (spec section 2).
func isLocal(ip netip.Addr) bool {
	ip = ip.Unmap()
	if ip.IsLoopback() {
		return true
	}
	if ip.IsUnspecified() || !ip.IsValid() {
		return false
	}
	localAddrs.Lock()
	defer localAddrs.Unlock()
	if localAddrs.set == nil || time.Since(localAddrs.when) > 5*time.Second {
		set := map[netip.Addr]bool{}
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if pfx, err := netip.ParsePrefix(a.String()); err == nil {
					set[pfx.Addr().Unmap()] = true
				}
			}
		}
		localAddrs.set, localAddrs.when = set, time.Now()
	}
	return localAddrs.set[ip]
}

var errNoRendezvous = errors.New("colo: no rendezvous for this address")

func (d *Dialer) dialColo(ctx context.Context, ap netip.AddrPort) (*Conn, error) {
	g := d.Geometry
	if g == (Geometry{}) {
		g = DefaultGeometry
	}
	if err := g.valid(); err != nil {
		return nil, err
	}
	for _, name := range lookupNames(ap) {
		fd, err := connectRendezvous(ctx, name)
		if err == unix.ECONNREFUSED || err == unix.ENOENT {
			continue
		}
		if err != nil {
			return nil, err
		}
		return handshakeClient(ctx, fd, ap, g)
	}
	return nil, errNoRendezvous
}

// connectRendezvous connects a SOCK_SEQPACKET socket to the abstract name.
func connectRendezvous(ctx context.Context, name string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	sa := &unix.SockaddrUnix{Name: "@" + name}
	for delay := 50 * time.Microsecond; ; delay *= 2 {
		err = unix.Connect(fd, sa)
		if err != unix.EAGAIN {
			break
		}
		// The listener's backlog is full: retry briefly, then give up (TCP fallback).
		if delay > 100*time.Millisecond || ctx.Err() != nil {
			break
		}
		time.Sleep(delay)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// RejectError is a server's REJECT answer to a HELLO.
type RejectError struct{ Reason, Version uint8 }

func (e *RejectError) Error() string {
	names := map[uint8]string{RejectBadMessage: "BAD_MESSAGE", RejectBadVersion: "BAD_VERSION",
		RejectBadSegment: "BAD_SEGMENT", RejectNeedCarrier: "NEED_CARRIER", RejectNotClaimed: "NOT_CLAIMED",
		RejectNoResources: "NO_RESOURCES"}
	return fmt.Sprintf("colo: server rejected the handshake: %s (reason %d, version %d)", names[e.Reason], e.Reason, e.Version)
}

// handshakeClient runs the client side of a DIRECT handshake on a connected control socket.
// It owns fd: on error everything is closed.
func handshakeClient(ctx context.Context, fd int, ap netip.AddrPort, g Geometry) (c *Conn, err error) {
	ctl := os.NewFile(uintptr(fd), "colo-ctl")
	var seg []byte
	cb, sb := -1, -1
	defer func() {
		if err != nil {
			ctl.Close()
			if seg != nil {
				unix.Munmap(seg)
			}
			if cb >= 0 {
				unix.Close(cb)
			}
			if sb >= 0 {
				unix.Close(sb)
			}
		}
	}()
	cred, err := peerCred(fd)
	if err != nil {
		return nil, err
	}
	if uid := uint32(os.Getuid()); cred.Uid != uid && cred.Uid != 0 && !listenerUIDs(ap.Port())[cred.Uid] {
		return nil, fmt.Errorf("colo: rendezvous owner uid %d does not own TCP port %d", cred.Uid, ap.Port())
	}
	l := g.layout()
	memfd, err := newSegmentFd(l.segmentSize)
	if err != nil {
		return nil, err
	}
	defer unix.Close(memfd)
	if seg, err = mapSegment(memfd, l.segmentSize); err != nil {
		return nil, err
	}
	h := header{Geometry: g, SegmentSize: l.segmentSize, Claim: ClaimDirect, ClientPid: uint32(os.Getpid()),
		ClientAddr: netip.AddrPortFrom(ap.Addr(), 0), ServerAddr: ap}
	h.encode(seg)
	if err = sealSegment(memfd); err != nil {
		return nil, err
	}
	if cb, err = newEventfd(); err != nil {
		return nil, err
	}
	if sb, err = newEventfd(); err != nil {
		return nil, err
	}
	hello := hsMsg{Type: MsgHello, Version: Version, Arg: ModeDirect}.encode()
	if err = unix.Sendmsg(fd, hello, unix.UnixRights(memfd, cb, sb), nil, 0); err != nil {
		return nil, os.NewSyscallError("sendmsg", err)
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(handshakeTimeout)
	}
	reply, err := recvHandshake(ctx, ctl, dl)
	if err != nil {
		return nil, err
	}
	m, err := decodeMsg(reply)
	if err != nil {
		return nil, err
	}
	switch {
	case m.Type == MsgReject:
		return nil, &RejectError{Reason: m.Arg, Version: m.Version}
	case m.Type != MsgWelcome || m.Version != Version:
		return nil, errBadMessage
	}
	c = &Conn{seg: seg, lay: l, ownBell: cb, peerBell: sb, ctl: ctl, ctlFd: fd, peerPid: int(cred.Pid),
		laddr: tcpAddr(h.ClientAddr), raddr: tcpAddr(ap)}
	if err = c.setup(); err != nil {
		return nil, err
	}
	return c, nil
}

// recvHandshake reads one handshake datagram (no descriptors expected) before dl.
func recvHandshake(ctx context.Context, ctl *os.File, dl time.Time) ([]byte, error) {
	ctl.SetReadDeadline(dl)
	defer ctl.SetReadDeadline(time.Time{})
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { ctl.SetReadDeadline(time.Now()) })
		defer stop()
	}
	rc, err := ctl.SyscallConn()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(4*8))
	var n, oobn, flags int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if oobn > 0 {
		closeRights(oob[:oobn])
		return nil, errBadMessage
	}
	if rerr != nil {
		return nil, os.NewSyscallError("recvmsg", rerr)
	}
	if n == 0 {
		return nil, errors.New("colo: control socket closed during handshake")
	}
	if flags&unix.MSG_TRUNC != 0 {
		return nil, errBadMessage
	}
	return buf[:n], nil
}
