package colo

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/bits"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultGeometry is the segment shape a Dialer offers when its Geometry is zero: byte rings that
// may grow to what the kernel lets a TCP socket buffer (defaultRingCapacity) and 16 message slots
// of 64 KiB in each direction. A ring starts at 2 KiB and grows when a write does not fit (up to
// RingCapacity, or the Conn's SetWriteBuffer); it shrinks back to 2 KiB, giving its pages back,
// once it has been empty and unwritten for about a second (spec/WIRE.md section 5, "Growing and
// shrinking"). Memory is touched lazily.
var DefaultGeometry = Geometry{RingCapacity: defaultRingCapacity(), SlotSize: 64 << 10, SlotCount: 16}

// defaultRingCapacity is what one direction of a TCP connection buffers at most: the largest send
// buffer the kernel gives a TCP socket (the third field of /proc/sys/net/ipv4/tcp_wmem) and about
// as much again in the receiver's, so twice it rounded up to a power of two within
// 256 KiB ..= 64 MiB, or 8 MiB if that cannot be read: the same as the Rust core's
// colo::default_ring.
func defaultRingCapacity() uint32 {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	f := strings.Fields(string(b))
	if err != nil || len(f) < 3 {
		return 8 << 20
	}
	m, err := strconv.ParseUint(f[2], 10, 32)
	if err != nil {
		return 8 << 20
	}
	m = min(max(m, 128<<10), 32<<20)
	return uint32(2) << bits.Len64(m-1)
}

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
	// Geometry of the segment offered to the server; zero means DefaultGeometry. Listeners
	// refuse a segment over 256 MiB (both directions' rings and pools), and the connection
	// then uses TCP: rings of up to 64 MiB fit.
	Geometry Geometry
	// TCPOnly disables colo: the Dialer always dials plain TCP.
	TCPOnly bool

	forceCarrier bool // tests: offer CARRIER mode from the start
	watchShort   bool // tests: with forceCarrier, apply the short-lived rule (shortlived.go)
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
		// A listener in another network namespace, as configured (spec section 11).
		if ap, dir, ok := netnsTarget(ctx, network, address); ok {
			g := d.Geometry
			if g == (Geometry{}) {
				g = DefaultGeometry
			}
			return netnsDial(ctx, network, ap, dir, g)
		}
		for _, ap := range localCandidates(ctx, network, address) {
			if shortPlain(ap, time.Now()) {
				break // its CARRIER connections are short-lived (shortlived.go)
			}
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
	// Take the segment first, so that HELLO follows the rendezvous connect at once and the
	// server, woken by the connect, finds it already queued: one that this process and a
	// listener known to answer both parked after an earlier connection (nothing to create, pass
	// or map: section 3, "Recycling"), or a fresh one.
	names := lookupNames(ap)
	var rec *clientEntry
	var ticket uint32
	var res *segRes
	if !d.forceCarrier {
		rec, ticket = takeClient(names, g)
	}
	if rec == nil {
		var err error
		if res, err = takeSeg(g); err != nil {
			return nil, err
		}
	}
	defer func() {
		if res != nil {
			putSeg(res) // never offered
		}
		if rec != nil {
			rec.p.release() // taken back and not used: its server lets go of its side later
		}
	}()
	// A name that the TCP listener does not use (another user bound it: an exact address's,
	// while the listener is a wildcard) is passed over for the listener's own, if the lookup
	// comes to it later, checked the same way: anyone may bind a free name, and that must not
	// keep a client off the listener's rendezvous.
	skipTo := ""
	for _, name := range names {
		if skipTo != "" && name != skipTo {
			continue
		}
		skipTo = ""
		fd, err := connectRendezvous(ctx, name)
		if err == unix.ECONNREFUSED || err == unix.ENOENT || err == unix.EAGAIN {
			// EAGAIN: a backlog full for connectWait, a listener that does not accept (another
			// user may bind a name first and fill its backlog itself): none, as a refusal.
			continue
		}
		if err != nil {
			return nil, err
		}
		if d.forceCarrier || knownCarrier(fd, name) {
			c, err := carrierClient(ctx, fd, ap, g, name)
			if skipTo = laterOwnName(err, names, name); skipTo != "" {
				logf("dial %v: %v; trying %s", ap, err, skipTo)
				continue
			}
			return d.watch(c, ap), err
		}
		r, rc := res, rec
		res, rec = nil, nil
		c, err := handshakeClient(ctx, fd, ap, g, r, rc, ticket, name)
		if skipTo = laterOwnName(err, names, name); skipTo != "" {
			// handshakeClient let go of the segment it was given: the next name's is new.
			logf("dial %v: %v; trying %s", ap, err, skipTo)
			continue
		}
		var rej *RejectError
		if errors.As(err, &rej) && rej.Reason == RejectNeedCarrier {
			// The server is an unmodified program under the shim, or takes DIRECT only from
			// its own uid (spec section 3): offer a carrier instead.
			if fd, err = connectRendezvous(ctx, name); err != nil {
				return nil, err
			}
			c, err := carrierClient(ctx, fd, ap, g, name)
			return d.watch(c, ap), err
		}
		return c, err
	}
	return nil, errNoRendezvous
}

// watch marks a CARRIER connection to ap for the short-lived rule (shortlived.go): its Close
// tells how it ended. c may be nil (a failed dial) or plain TCP (an offer not taken): neither is
// counted. A dial that found no free port to offer from (a range full of TIME_WAIT) is not a
// short connection: a plain period would keep the next long-lived connections off shared
// memory once ports are free.
func (d *Dialer) watch(c *Conn, ap netip.AddrPort) *Conn {
	if d.forceCarrier && !d.watchShort {
		return c
	}
	if c != nil && c.tcp == nil {
		c.shortAP, c.born = ap, time.Now()
	}
	return c
}

// laterOwnName is the TCP listener's own rendezvous name when err says the name reached was
// not it (otherNameError) and it comes after reached in names; else "".
func laterOwnName(err error, names []string, reached string) string {
	var other *otherNameError
	if !errors.As(err, &other) {
		return ""
	}
	for i, n := range names {
		if n == reached {
			for _, later := range names[i+1:] {
				if later == other.own {
					return later
				}
			}
		}
	}
	return ""
}

// connectWait bounds how long connectRendezvous waits for room in a full backlog (the Rust
// core's colo_sys::seqpacket::CONNECT_WAIT). A colo listener's backlog is 4096 deep and its
// rvLoop drains it; one full for longer is a listener that does not accept, which the lookup
// passes over as it does a refusal (dialColo).
const connectWait = 10 * time.Millisecond

// connectRendezvous connects a SOCK_SEQPACKET socket to the abstract name: EAGAIN when its
// backlog stayed full for connectWait.
func connectRendezvous(ctx context.Context, name string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	refuseRights(fd) // our control socket takes no descriptor, ever (spec section 6)
	sa := &unix.SockaddrUnix{Name: "@" + name}
	deadline := time.Now().Add(connectWait)
	for delay := 50 * time.Microsecond; ; delay *= 2 {
		err = unix.Connect(fd, sa)
		if err != unix.EAGAIN {
			break
		}
		// The listener's backlog is full: retry briefly, then give up (the next name, or TCP).
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			break
		}
		time.Sleep(min(delay, left))
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// needCarrier remembers, by rendezvous name, the pid of a listener that answered a DIRECT HELLO
// with REJECT(NEED_CARRIER): later dials to it offer CARRIER at once.
var needCarrier sync.Map

// knownCarrier reports whether the listener reached on fd (rendezvous name) answered
// NEED_CARRIER before.
func knownCarrier(fd int, name string) bool {
	pid, ok := needCarrier.Load(name)
	if !ok {
		return false
	}
	cred, err := peerCred(fd)
	return err == nil && cred.Pid == pid.(int32)
}

// RejectError is a server's REJECT answer to a HELLO.
type RejectError struct{ Reason, Version uint8 }

func (e *RejectError) Error() string {
	names := map[uint8]string{RejectBadMessage: "BAD_MESSAGE", RejectBadVersion: "BAD_VERSION",
		RejectBadSegment: "BAD_SEGMENT", RejectNeedCarrier: "NEED_CARRIER", RejectNotClaimed: "NOT_CLAIMED",
		RejectNoResources: "NO_RESOURCES", RejectNotServed: "NOT_SERVED"}
	return fmt.Sprintf("colo: server rejected the handshake: %s (reason %d, version %d)", names[e.Reason], e.Reason, e.Version)
}

// clientSide is what a client prepares before a HELLO: the control socket and the segment, fresh
// (segRes) or taken back after an earlier connection (rec, with the server's ticket).
type clientSide struct {
	ctl  *os.File
	fd   int
	cred *unix.Ucred
	*segRes
	sent   bool // the descriptors went out with a HELLO: never reuse them
	rec    *parked
	ticket uint32
	proof  []byte // a cross-namespace offer's nonces (spec section 11), written at hProof
	// answerUID is the uid that sent the WELCOME, as the kernel vouched for it (foreignSender
	// where it came without credentials); answered says one came.
	answerUID uint32
	answered  bool
}

// foreignSender stands for the sender of an answer that came without credentials: judged
// another user (no process runs as uid 2^32-1).
const foreignSender = ^uint32(0)

func (cs *clientSide) close() {
	cs.ctl.Close()
	if cs.segRes != nil {
		if cs.sent {
			cs.segRes.close()
		} else {
			putSeg(cs.segRes)
		}
	}
	if cs.rec != nil {
		cs.rec.release() // never parked again: its server keeps its side for our HELLO a while
		cs.rec = nil
	}
}

// prepareClient checks the server's credentials (spec section 2) and takes a ready segment:
// rec, a segment taken back from the listener name, if that is whom fd reaches
// (same pid), else res or a new one. It owns fd, res and rec: on error everything is closed.
func prepareClient(fd int, ap netip.AddrPort, g Geometry, res *segRes, rec *clientEntry, ticket uint32, name string) (*clientSide, error) {
	cs := &clientSide{ctl: os.NewFile(uintptr(fd), "colo-ctl"), fd: fd, segRes: res}
	if rec != nil {
		cs.rec, cs.ticket = rec.p, ticket
	}
	var err error
	if cs.cred, err = peerCred(fd); err != nil {
		cs.close()
		return nil, err
	}
	// Nothing is sent before this proof (spec section 2, "Peer check").
	if err := rendezvousTrusted(ap, name, cs.cred.Uid); err != nil {
		cs.close()
		return nil, err
	}
	if cs.rec != nil && (rec.name != name || rec.serverPid != int(cs.cred.Pid) || foreignUID(cs.cred.Uid)) {
		// Parked with a listener that has been replaced, or (a listener of another user, whose
		// ring we read through the memfd, which a parked segment no longer has: Conn.readThrough)
		// not to be recycled: its server lets go of its side later.
		cs.rec.release()
		cs.rec = nil
	}
	if cs.segRes == nil && cs.rec == nil {
		if cs.segRes, err = takeSeg(g); err != nil {
			cs.close()
			return nil, err
		}
	}
	return cs, nil
}

// hello writes the header and sends HELLO with the segment's memfd, or for a segment taken
// back, rewrites the header's bytes 0..96 (pids and address records; the rest is as both sides
// left it) and sends HELLO with RECYCLE, the server's ticket and no descriptors.
func (cs *clientSide) hello(h header, mode uint8) error {
	if cs.rec != nil {
		h.Geometry, h.SegmentSize = cs.rec.lay.Geometry, cs.rec.lay.segmentSize
		h.ClientPid, h.ServerPid = uint32(os.Getpid()), uint32(cs.cred.Pid)
		// Plain writes: nobody else uses the segment (our compare-and-swap proved it); the
		// sendmsg below publishes them.
		h.encode(cs.rec.seg[:hParked:hParked])
		msg := hsMsg{Type: MsgHello, Version: Version, Arg: ModeDirect, Flags: flagRecycle, Ticket: cs.ticket}.encode()
		if err := unix.Sendmsg(cs.fd, msg, nil, nil, 0); err != nil {
			return os.NewSyscallError("sendmsg", err)
		}
		return nil
	}
	h.Geometry, h.SegmentSize, h.ClientPid = cs.lay.Geometry, cs.lay.segmentSize, uint32(os.Getpid())
	h.encode(cs.seg)
	var flags uint32
	clear(cs.seg[hProof : hProof+24]) // reserved unless this offer crosses namespaces
	if cs.proof != nil {
		copy(cs.seg[hProof:hProof+len(cs.proof)], cs.proof)
		flags = flagNetns
	}
	startRings(cs.seg, cs.lay)
	msg := hsMsg{Type: MsgHello, Version: Version, Arg: mode, Flags: flags}.encode()
	cs.sent = true
	// The segment's memfd, alone (spec section 3). Ours stays open until the connection is set
	// up (Conn.readThrough).
	if err := unix.Sendmsg(cs.fd, msg, unix.UnixRights(cs.memfd), nil, 0); err != nil {
		return os.NewSyscallError("sendmsg", err)
	}
	return nil
}

// answer waits for WELCOME (nil) or REJECT (*RejectError) until dl. It records who sent it
// (answerUID): the rendezvous's SO_PEERCRED is the listener's at its listen, and a server that
// listened as us may serve as another user now (a master that starts its workers as nobody),
// whose user can take over its memfd and control socket; its ring is then read through the memfd
// (Conn.readThrough). SO_PASSCRED is on only while the answer is awaited: a socket without an
// address that sends while it is on is given one.
func (cs *clientSide) answer(ctx context.Context, dl time.Time) error {
	unix.SetsockoptInt(cs.fd, unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	reply, uid, err := recvHandshake(ctx, cs.ctl, dl)
	unix.SetsockoptInt(cs.fd, unix.SOL_SOCKET, unix.SO_PASSCRED, 0)
	if err != nil {
		return err
	}
	cs.answerUID, cs.answered = uid, true
	m, err := decodeMsg(reply)
	if err != nil {
		return err
	}
	switch {
	case m.Type == MsgReject:
		return &RejectError{Reason: m.Arg, Version: m.Version}
	case m.Type != MsgWelcome || m.Version != Version:
		return errBadMessage
	}
	return nil
}

// conn turns an answered handshake into the client side of the connection.
func (cs *clientSide) conn(laddr, raddr *net.TCPAddr) *Conn {
	c := &Conn{ctl: cs.ctl, ctlFd: cs.fd, peerPid: int(cs.cred.Pid), peerUID: cs.cred.Uid, laddr: laddr, raddr: raddr}
	if cs.answered && foreignUID(cs.answerUID) {
		c.peerUID = cs.answerUID
	}
	memfd := -1
	if p := cs.rec; p != nil {
		c.seg, c.lay = p.seg, p.lay
	} else {
		c.seg, c.lay = cs.seg, cs.lay
		memfd, cs.memfd = cs.memfd, -1
	}
	c.setup(memfd)
	cs.segRes, cs.rec = nil, nil // the connection owns it now
	return c
}

func handshakeDeadline(ctx context.Context) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return time.Now().Add(handshakeTimeout)
}

// handshakeClient runs the client side of a DIRECT handshake on a connected control socket.
// It owns fd: on error everything is closed.
func handshakeClient(ctx context.Context, fd int, ap netip.AddrPort, g Geometry, res *segRes, rec *clientEntry, ticket uint32, name string) (*Conn, error) {
	cs, err := prepareClient(fd, ap, g, res, rec, ticket, name)
	if err != nil {
		return nil, err
	}
	h := header{Claim: ClaimDirect, ClientAddr: netip.AddrPortFrom(ap.Addr(), 0), ServerAddr: ap}
	if err := cs.hello(h, ModeDirect); err != nil {
		cs.close()
		return nil, err
	}
	// The backlog (spec section 3): wait a little for the first answer of a listener, not at all
	// for one (same name, same pid) that has welcomed us before; without an answer the
	// connection is established pending, and the answer is read later by a drain of the
	// control socket (drainCtl).
	//
	// Not for an IPv4 dial that reached the IPv6 wildcard: that listener may be IPV6_V6ONLY, and
	// its REJECT(NOT_SERVED) must come before the dial returns, as TCP's refusal would. Nor for a
	// server of another uid, which takes DIRECT only if it opted in: its answer, most likely
	// NEED_CARRIER, must be read before bytes go into the ring; without one in time the client
	// offers a carrier (whose claim waits for the server's accept) and abandons this HELLO.
	crossFamily := ap.Addr().Unmap().Is4() && strings.HasPrefix(name, "colo/1/[")
	mustAnswer := crossFamily || cs.cred.Uid != uint32(os.Getuid())
	pending := true
	// A listener is known by name and pid, and a pid is reused: one of another uid now (the
	// listener that welcomed us exited, another user's took its port and its pid) is waited for.
	if pid, ok := welcomed.Load(name); !ok || pid.(int32) != cs.cred.Pid || mustAnswer {
		wait := firstAnswerWait
		if mustAnswer {
			wait = mustAnswerWait
		}
		dl := time.Now().Add(wait)
		if cdl, ok := ctx.Deadline(); ok && cdl.Before(dl) {
			dl = cdl
		}
		err := cs.answer(ctx, dl)
		var rej *RejectError
		switch {
		case err == nil && foreignUID(cs.answerUID) && cs.rec != nil:
			// Served by another user now, and a recycled segment has no memfd to read its
			// ring through (Conn.readThrough): refused, as a segment the server cannot take.
			welcomed.Delete(name)
			cs.close()
			return nil, &RejectError{Reason: RejectBadSegment, Version: Version}
		case err == nil:
			pending = false
			if !foreignUID(cs.answerUID) {
				welcomed.Store(name, cs.cred.Pid)
			}
		case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil && mustAnswer:
			cs.close()
			return nil, &RejectError{Reason: RejectNeedCarrier, Version: Version}
		case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil && cs.rec != nil:
			// Pending, its answer to come without credentials, on a recycled segment that
			// has no memfd to read its ring through: refused, as a foreign answer's.
			welcomed.Delete(name)
			cs.close()
			return nil, &RejectError{Reason: RejectBadSegment, Version: Version}
		case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil:
			// Pending, its answer to come without credentials: nobody vouched for who serves
			// it (the listener may have handed its descriptors to another user since), so it
			// is read through the memfd, and its late WELCOME does not make the listener known.
			cs.answerUID, cs.answered = foreignSender, true
		case errors.As(err, &rej) && rej.Reason == RejectNeedCarrier:
			needCarrier.Store(name, cs.cred.Pid)
			cs.close()
			return nil, err
		default:
			cs.close()
			return nil, err
		}
	}
	c := cs.conn(tcpAddr(h.ClientAddr), tcpAddr(ap))
	if pending {
		c.pending.Store(true) // before the Conn is returned: drainCtl's own from then on
		if !cs.answered {
			c.welcomeName = name
		}
	}
	c.parkName = name
	return c, nil
}

// firstAnswerWait bounds how long a DIRECT client waits for a new listener's answer before the
// connection is established pending (spec section 3 uses 20 ms).
const firstAnswerWait = 20 * time.Millisecond

// mustAnswerWait bounds the wait for an answer that must come before the client writes (a
// server of another uid, an IPv4 dial that reached the IPv6 wildcard). It is longer than
// firstAnswerWait because the client does not go pending without it: it falls back to a
// carrier, whose claim waits for the same slow server's accept anyway, so the wait costs
// nothing a timely answer would not; it is Rust's (Options::connect_timeout's default).
const mustAnswerWait = 200 * time.Millisecond

// welcomed remembers, by rendezvous name, the pid of the listener that last answered WELCOME.
var welcomed sync.Map

// carrierAnswerTimeout bounds the steps of a set-up that wait on the other side's kernel or
// shim rather than on its program: the wait for a WELCOME the server owes once it has claimed
// an offer (its claim is done; only the datagram is on the way); on the path to another
// namespace (spec/WIRE.md section 11), the client's connect to the rendezvous its server named
// and the first wait for the answer to its offer there (netns.go), and the server's write of
// its answer onto the TCP stream and its wait for the offer that follows it (netns_server.go).
// The wait on a server's program (its accept) is carrierWait.
const carrierAnswerTimeout = 2 * time.Second

// carrierClient offers a CARRIER segment for a loopback TCP connection (spec section 3): bind,
// HELLO with the 4-tuple, connect, then WELCOME (colo) or abandon (plain TCP).
func carrierClient(ctx context.Context, fd int, ap netip.AddrPort, g Geometry, name string) (*Conn, error) {
	cs, err := prepareClient(fd, ap, g, nil, nil, 0, name)
	if err != nil {
		return nil, err
	}
	network := "tcp4"
	if !ap.Addr().Is4() {
		network = "tcp6"
	}
	var offered bool
	// No keep-alive probes (Go's default turns them on, four setsockopts a dial): the carrier
	// carries no bytes, and a peer's death reaches us through the control socket (both ends are
	// on this host, and the kernel closes a dead process's sockets). A connection that goes on
	// as plain TCP gets Go's default (plainCarrier).
	nd := net.Dialer{KeepAlive: -1, Control: func(_, _ string, rc syscall.RawConn) error {
		var ierr error
		cerr := rc.Control(func(s uintptr) {
			port, err := bindEphemeral(int(s), ap.Addr())
			if err != nil {
				ierr = err
				return
			}
			h := header{Claim: ClaimOffered, ClientAddr: netip.AddrPortFrom(ap.Addr(), uint16(port)), ServerAddr: ap}
			ierr = cs.hello(h, ModeCarrier)
			offered = ierr == nil
		})
		if cerr != nil {
			return cerr
		}
		return ierr
	}}
	tc, err := nd.DialContext(ctx, network, ap.String())
	if err != nil {
		if offered {
			// SYNC POINT with the server's CompareAndSwap of claim in claimCarrier: a server
			// that looks later finds ABANDONED and does not claim.
			atomic.CompareAndSwapUint32(u32at(cs.seg, hClaim), ClaimOffered, ClaimAbandoned)
		}
		cs.close()
		return nil, err
	}
	// The server answers when its application accepts: a late one is met as over TCP after
	// COLO_CARRIER_TIMEOUT_MS (500 ms, as the Rust core and the shim wait), on plain TCP.
	dl := time.Now().Add(carrierWait())
	if cdl, ok := ctx.Deadline(); ok && cdl.Before(dl) {
		dl = cdl
	}
	asked := time.Now()
	aerr := cs.answer(ctx, dl)
	if aerr != nil {
		// Exactly one of this CAS and the server's OFFERED -> CLAIMED wins. SYNC POINT with
		// the server's CompareAndSwap of claim in claimCarrier (carrier.go).
		if atomic.CompareAndSwapUint32(u32at(cs.seg, hClaim), ClaimOffered, ClaimAbandoned) {
			logf("carrier offer to %v not taken (%v): plain TCP", ap, aerr)
			cs.close() // nothing was written into the ring: nothing to copy into the TCP socket
			return plainCarrier(tc), nil
		}
		// The server claimed first: its WELCOME is on the way.
		if aerr = cs.answer(context.Background(), time.Now().Add(carrierAnswerTimeout)); aerr != nil {
			cs.close()
			tc.Close()
			return nil, aerr
		}
	}
	c := cs.conn(tc.LocalAddr().(*net.TCPAddr), tc.RemoteAddr().(*net.TCPAddr))
	c.carrier = tc
	c.setupTook = time.Since(asked) // the set-up cost the short-lived rule weighs, as the shim's
	return c, nil
}

// plainCarrier is a carrier whose offer was not taken, as the plain TCP connection it goes on
// as: with the keep-alive probes Go's net.Dialer turns on by default.
func plainCarrier(tc net.Conn) *Conn {
	t := tc.(*net.TCPConn)
	t.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true})
	return &Conn{tcp: t}
}

// recvHandshake reads one handshake datagram (no descriptors expected) before dl, and the uid
// of its sender where it carries credentials (foreignSender otherwise).
func recvHandshake(ctx context.Context, ctl *os.File, dl time.Time) ([]byte, uint32, error) {
	ctl.SetReadDeadline(dl)
	defer ctl.SetReadDeadline(time.Time{})
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { ctl.SetReadDeadline(time.Now()) })
		defer stop()
	}
	rc, err := ctl.SyscallConn()
	if err != nil {
		return nil, foreignSender, err
	}
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(4*maxRights)+unix.CmsgSpace(unix.SizeofUcred))
	var n, oobn, flags int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, foreignSender, ctx.Err()
		}
		return nil, foreignSender, err
	}
	uid := foreignSender
	if oobn > 0 {
		if len(rightsIn(oob[:oobn])) > 0 {
			closeRights(oob[:oobn])
			return nil, foreignSender, errBadMessage
		}
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for i := range msgs {
			// Pid 0: the kernel attached none (SO_PASSCRED was off at the send).
			if cred, err := unix.ParseUnixCredentials(&msgs[i]); err == nil && cred.Pid > 0 {
				uid = cred.Uid
			}
		}
	}
	if rerr != nil {
		return nil, foreignSender, os.NewSyscallError("recvmsg", rerr)
	}
	if n == 0 {
		return nil, foreignSender, errors.New("colo: control socket closed during handshake")
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return nil, foreignSender, errBadMessage
	}
	return buf[:n], uid, nil
}
