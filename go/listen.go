package colo

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// maxUnaccepted bounds the connections taken from the kernel (TCP and rendezvous) that the
// application has not accepted yet; beyond it the listener stops accepting and the kernel's
// backlogs apply, as with a plain net.Listener.
const maxUnaccepted = 1024

// helloTimeout bounds how long a server waits for a HELLO on a new rendezvous connection.
const helloTimeout = 5 * time.Second

// maxHalfOpen bounds the rendezvous connections a listener holds unanswered: waiting for their
// HELLO (helloTimeout), CARRIER offers waiting for their TCP connection (offerTimeout). A DIRECT
// connection answered WELCOME counts against maxUnaccepted instead until Accept takes it
// (enqueue): its client may already use it. maxHalfOpenPerUID is one
// client uid's share of them. Beyond either, a new rendezvous connection gets
// REJECT(NO_RESOURCES) (its client uses TCP). They have their own bound, apart from
// maxUnaccepted, so that silent rendezvous clients never hold up plain TCP accepts. Each holds
// descriptors (its control socket; an offer also its memfd), where over TCP a client that has
// not finished its handshake holds none of the program's: under a low limit of open files a
// listener keeps an eighth of its soft limit instead, at least 16 (halfOpenBound).
const (
	maxHalfOpen       = 1024
	maxHalfOpenPerUID = maxHalfOpen / 4
)

// halfOpenBound is how many rendezvous connections a listener holds unanswered under a soft
// limit of soft open files (0: none known): maxHalfOpen, or an eighth of soft if less, at
// least 16; a client uid a quarter of them.
func halfOpenBound(soft uint64) int {
	if soft == 0 || soft/8 >= maxHalfOpen {
		return maxHalfOpen
	}
	return max(int(soft/8), 16)
}

// softOpenFiles is the process's soft RLIMIT_NOFILE (0 if unknown).
func softOpenFiles() uint64 {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) != nil || lim.Cur == unix.RLIM_INFINITY {
		return 0
	}
	return lim.Cur
}

// Listener accepts colo connections on its rendezvous name and plain TCP connections on its
// TCP address. It implements net.Listener; Accept returns *Conn values (AcceptColo avoids the
// type assertion).
type Listener struct {
	tcp  *net.TCPListener
	addr netip.AddrPort
	name string
	rv   atomic.Pointer[os.File] // rendezvous socket; nil while the name is taken (TCP only)
	// closeMu orders a late bind of the rendezvous (takeOverVacant) with Close: either the bind
	// comes first and Close closes it, or Close does and no bind follows.
	closeMu  sync.Mutex
	rvLooked time.Time // the last look for a vacant name (tcpLoop's goroutine only)

	conns     chan *Conn
	errs      chan error
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	offersMu     sync.Mutex
	offers       map[offerKey][]*offer // oldest first; at most one per client uid (carrier.go)
	offerEvt     chan struct{}         // closed (and replaced) by offerEvent when a HELLO has been read
	claimWaiters atomic.Int32          // claims waiting in claimCarrier for unread HELLOs (partners named at the uses)
	sem          chan struct{}         // one token per TCP connection accepted but not yet handed to Accept
	halfMu       sync.Mutex
	halfOpen     int                                // rendezvous connections held (see maxHalfOpen)
	halfByUID    map[uint32]int                     // ... by client uid
	halfMost     int                                // how many are held at most (halfOpenBound)
	carrierOnly  atomic.Bool                        // a setting: read per HELLO, orders nothing
	v6only       bool                               // the TCP socket is IPv6 with IPV6_V6ONLY: it takes no IPv4 connection
	directAny    atomic.Bool                        // SetDirectFromAnyUID; a setting: orders nothing
	testAnswer   atomic.Pointer[func(c *Conn) bool] // tests: called before WELCOME; false: REJECT(NO_RESOURCES); the Store publishes the func
	rvMu         sync.Mutex                         // serializes accepts on the rendezvous socket with pending counting
	pending      atomic.Int32                       // accepted control connections whose HELLO is not read yet (partners at the uses)
	silentMu     sync.Mutex                         // guards silent (see silent.go)
	silent       map[int]struct{}                   // pending connections whose goroutine found nothing to read
	parked       *parkTable                         // segments of closed DIRECT connections, kept for their clients' next dials

	netns *netnsServer // the rendezvous for other network namespaces (COLO_NETNS_DIR); nil: none
}

// Listen listens on the TCP address (network "tcp", "tcp4" or "tcp6") and on the matching colo
// rendezvous name. Plain TCP clients reach the same listener. The result is a *Listener; its
// Accept returns *Conn values.
//
//	ln, err := colo.Listen("tcp", "127.0.0.1:8080")
//	http.Serve(ln, mux)
func Listen(network, address string) (net.Listener, error) {
	l, err := ListenColo(network, address)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// ListenColo is Listen returning the *Listener (for AcceptColo and Colo).
func ListenColo(network, address string) (*Listener, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, &net.OpError{Op: "listen", Net: network, Err: net.UnknownNetworkError(network)}
	}
	tl, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	l := &Listener{tcp: tl.(*net.TCPListener), conns: make(chan *Conn), errs: make(chan error, 1),
		sem:  make(chan struct{}, maxUnaccepted),
		done: make(chan struct{}), offers: map[offerKey][]*offer{}, offerEvt: make(chan struct{}), parked: newParkTable(), halfByUID: map[uint32]int{},
		halfMost: halfOpenBound(softOpenFiles())}
	ta := l.tcp.Addr().(*net.TCPAddr).AddrPort()
	l.addr = netip.AddrPortFrom(ta.Addr().Unmap(), ta.Port())
	if l.addr.Addr().Is6() {
		l.v6only = tcpV6only(l.tcp)
	}
	l.directAny.Store(os.Getenv("COLO_DIRECT_ANY_UID") == "1")
	l.name = rendezvousName(l.addr)
	if err := l.bindRendezvous(); err != nil {
		logf("listen %v: rendezvous %q unavailable (%v): serving plain TCP until it is free", l.addr, l.name, err)
		l.rvLooked = time.Now()
	}
	l.netns = bindNetns(l.addr.Port())
	l.wg.Add(1)
	go l.tcpLoop()
	if rv := l.rv.Load(); rv != nil {
		l.wg.Add(1)
		go l.rvLoop(rv)
	}
	if l.netns != nil {
		l.wg.Add(1)
		go l.rvLoop(l.netns.rv)
	}
	return l, nil
}

func (l *Listener) bindRendezvous() error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: "@" + l.name}); err != nil {
		unix.Close(fd)
		return err
	}
	if err := unix.Listen(fd, 4096); err != nil {
		unix.Close(fd)
		return err
	}
	l.rv.Store(os.NewFile(uintptr(fd), "colo-rendezvous"))
	return nil
}

// takeOverVacant binds the rendezvous name of a listener that serves plain TCP only because the
// name was bound when it started (any user may hold a free abstract name for a moment, spec
// section 2): at a TCP accept, at most once a second (tcpLoop's goroutine only).
func (l *Listener) takeOverVacant() {
	if l.rv.Load() != nil || time.Since(l.rvLooked) < time.Second {
		return
	}
	l.rvLooked = time.Now()
	l.closeMu.Lock()
	defer l.closeMu.Unlock()
	select {
	case <-l.done:
		return
	default:
	}
	if l.bindRendezvous() != nil {
		return
	}
	logf("listen %v: rendezvous %q bound: serving colo offers", l.addr, l.name)
	// tcpLoop holds a count of wg: this Add cannot race with Close's Wait at zero.
	l.wg.Add(1)
	go l.rvLoop(l.rv.Load())
}

// tcpV6only reports whether the listening socket has IPV6_V6ONLY (Go sets it for network
// "tcp6" and clears it for "tcp"); false when it cannot be read.
func tcpV6only(tl *net.TCPListener) bool {
	rc, err := tl.SyscallConn()
	if err != nil {
		return false
	}
	v := 0
	rc.Control(func(fd uintptr) {
		v, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_V6ONLY)
	})
	return v == 1
}

// SetDirectFromAnyUID is a listener's opt-in: take DIRECT connections (no TCP handshake) from
// clients of any uid, not only of its own. A DIRECT connection passes no firewall (netfilter),
// cgroup BPF or Landlock rule; so by default a client of another uid is told NEED_CARRIER and
// connects with a CARRIER offer over a real TCP connection, which those rules admit or refuse
// (docs/ARCHITECTURE.md, "Trust comes from the admitted connection"). Opt in only where no such
// rule must hold between local users. The default is COLO_DIRECT_ANY_UID=1 in the environment,
// else off.
func (l *Listener) SetDirectFromAnyUID(on bool) { l.directAny.Store(on) }

// admitsDirect reports whether the client on the control socket cfd may connect DIRECT: it runs
// as this process's uid, or the listener opted in (SetDirectFromAnyUID).
func (l *Listener) admitsDirect(cfd int) bool {
	if l.directAny.Load() {
		return true
	}
	cred, err := peerCred(cfd)
	return err == nil && cred.Uid == uint32(os.Getuid())
}

// Addr returns the TCP address the listener is bound to (a *net.TCPAddr).
func (l *Listener) Addr() net.Addr { return l.tcp.Addr() }

// Colo reports whether the listener holds its rendezvous name (false: plain TCP only).
func (l *Listener) Colo() bool { return l.rv.Load() != nil }

// Accept waits for and returns the next connection (a *Conn).
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.AcceptColo()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// AcceptColo is Accept returning *Conn.
func (l *Listener) AcceptColo() (*Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case err := <-l.errs:
		return nil, err
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.tcp.Addr(), Err: net.ErrClosed}
	}
}

// Close stops listening on both the TCP address and the rendezvous name. Connections already
// accepted stay open.
func (l *Listener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		l.closeMu.Lock()
		close(l.done)
		rv := l.rv.Load()
		l.closeMu.Unlock()
		err = l.tcp.Close()
		if rv != nil {
			rv.Close()
		}
		if l.netns != nil {
			l.netns.close()
		}
		l.wg.Wait()
		l.offersMu.Lock()
		for k, list := range l.offers {
			for _, o := range list {
				o.drop()
			}
			delete(l.offers, k)
		}
		l.offersMu.Unlock()
		l.parked.close()
	})
	return err
}

func (l *Listener) deliver(c *Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *Listener) tcpLoop() {
	defer l.wg.Done()
	delay := time.Duration(0)
	for {
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return
		}
		tc, err := l.tcp.AcceptTCP()
		if err != nil {
			<-l.sem
			select {
			case <-l.done:
				return
			default:
			}
			if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) || errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM) {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			select {
			case l.errs <- err:
			case <-l.done:
			}
			return
		}
		delay = 0
		l.takeOverVacant()
		if ra, ok := tc.RemoteAddr().(*net.TCPAddr); ok && (l.netns != nil || netnsConfigured()) && !isLocal(ra.AddrPort().Addr()) && netnsClientAllowed(ra.AddrPort().Addr()) {
			// From another network namespace: its proposal is answered on the connection's own
			// goroutine (the wait for its first bytes holds up no other accept).
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				defer func() { <-l.sem }()
				c := l.netnsClaim(tc)
				if c == nil {
					c = &Conn{tcp: tc}
				}
				l.deliver(c)
			}()
			continue
		}
		c := l.claimCarrier(tc)
		if c == nil {
			c = &Conn{tcp: tc}
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() { <-l.sem }()
			l.deliver(c)
		}()
	}
}

// rvLoop accepts rendezvous connections and handles each HELLO on its own goroutine. Nothing a
// client sends can stop this loop.
func (l *Listener) rvLoop(rv *os.File) {
	defer l.wg.Done()
	rc, err := rv.SyscallConn()
	if err != nil {
		return
	}
	delay := time.Duration(0)
	for {
		var cfd int
		var aerr error
		err := rc.Read(func(fd uintptr) bool {
			cfd, aerr = l.acceptControl(int(fd))
			return aerr != unix.EAGAIN
		})
		if err != nil {
			return // closed
		}
		if aerr != nil {
			if aerr == unix.EINTR || aerr == unix.ECONNABORTED {
				continue
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(delay):
			case <-l.done:
				return
			}
			continue
		}
		delay = 0
		if uid, ok := l.admitHalfOpen(cfd); ok {
			l.serveNew(cfd, uid)
		}
	}
}

// admitHalfOpen counts a rendezvous connection just accepted against maxHalfOpen and its uid's
// share; beyond them it answers REJECT(NO_RESOURCES), closes it and reports false.
func (l *Listener) admitHalfOpen(cfd int) (uint32, bool) {
	why := ""
	cred, err := peerCred(cfd)
	if err != nil {
		why = "peer credentials: " + err.Error()
	} else {
		l.halfMu.Lock()
		switch {
		case l.halfOpen >= l.halfMost:
			why = fmt.Sprintf("rendezvous connections held reached %d", l.halfMost)
		case l.halfByUID[cred.Uid] >= l.halfMost/4:
			why = fmt.Sprintf("rendezvous connections of this uid reached %d", l.halfMost/4)
		default:
			l.halfOpen++
			l.halfByUID[cred.Uid]++
		}
		l.halfMu.Unlock()
	}
	if why == "" {
		return cred.Uid, true
	}
	l.pending.Add(-1)
	reject(cfd, RejectNoResources)
	unix.Close(cfd)
	logf("listen %v: refused a rendezvous client: %s", l.addr, why)
	return 0, false
}

// releaseHalfOpen gives back the place admitHalfOpen took for a connection of uid.
func (l *Listener) releaseHalfOpen(uid uint32) {
	l.halfMu.Lock()
	l.halfOpen--
	if l.halfByUID[uid]--; l.halfByUID[uid] <= 0 {
		delete(l.halfByUID, uid)
	}
	l.halfMu.Unlock()
}

// acceptControl accepts one rendezvous connection without blocking and counts it as pending
// until its HELLO is read (claimCarrier waits for pending HELLOs).
func (l *Listener) acceptControl(rvfd int) (int, error) {
	l.rvMu.Lock()
	defer l.rvMu.Unlock()
	cfd, _, err := unix.Accept4(rvfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
	if err == nil {
		l.pending.Add(1) // SYNC POINT with the Load in unreadHellos
	}
	return cfd, err
}

// spawnHello serves one accepted control connection; the caller holds its place (admitHalfOpen),
// given back when the HELLO has been answered and its connection accepted (or refused).
func (l *Listener) spawnHello(cfd int, h *hello, uid uint32) {
	if h == nil {
		h = &hello{err: unix.EAGAIN}
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		if c := l.serveHello(cfd, h); c != nil {
			l.enqueue(c, uid)
		} else {
			l.releaseHalfOpen(uid)
		}
	}()
}

// enqueue hands a rendezvous connection answered WELCOME to Accept, moving it from the
// half-open bound (its place for uid is given back) to maxUnaccepted, whose token it takes first
// (waiting, as tcpLoop does, while the application is behind; the token is given back once
// Accept has it). A client may have returned from its dial before that answer (pending, spec
// section 3), and nothing but a late REJECT could refuse it now; so an answered connection
// must never fill the bound that refuses new rendezvous connections with REJECT(NO_RESOURCES).
func (l *Listener) enqueue(c *Conn, uid uint32) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		l.releaseHalfOpen(uid)
		c.Close()
		return
	}
	l.releaseHalfOpen(uid)
	select {
	case l.conns <- c: // an Accept is waiting
		<-l.sem
	default:
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() { <-l.sem }()
			l.deliver(c)
		}()
	}
}

func sendMsg(fd int, m hsMsg) error {
	return unix.Sendmsg(fd, m.encode(), nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
}

func reject(fd int, reason uint8) {
	sendMsg(fd, hsMsg{Type: MsgReject, Version: Version, Arg: reason})
}

// hello is one datagram read from a new control connection.
type hello struct {
	buf            [64]byte
	oob            []byte
	n, oobn, flags int
	err            error
}

func readHello(fd int, h *hello, flags int) bool {
	if h.oob == nil {
		h.oob = make([]byte, unix.CmsgSpace(4*maxRights))
	}
	h.n, h.oobn, h.flags, _, h.err = unix.Recvmsg(fd, h.buf[:], h.oob, flags|unix.MSG_CMSG_CLOEXEC)
	return h.err != unix.EAGAIN
}

// isDirectHello tells a well-formed DIRECT HELLO, which is answered without blocking.
func (h *hello) isDirectHello() bool {
	m, err := decodeMsg(h.buf[:h.n])
	return h.err == nil && err == nil && h.flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) == 0 &&
		m.Type == MsgHello && m.Arg == ModeDirect
}

// serveNew handles a control connection just accepted by rvLoop (holding its place, see
// admitHalfOpen). The HELLO usually is already there (clients send it right after connecting): a
// DIRECT one is then answered here, without a goroutine hand-off; anything else gets its own
// goroutine.
func (l *Listener) serveNew(cfd int, uid uint32) {
	h := &hello{}
	if !readHello(cfd, h, unix.MSG_DONTWAIT) || !h.isDirectHello() {
		l.spawnHello(cfd, h, uid)
		return
	}
	c := l.handleHello(cfd, os.NewFile(uintptr(cfd), "colo-ctl"), h)
	if c == nil {
		l.releaseHalfOpen(uid)
		return
	}
	l.enqueue(c, uid)
}

// serveHello reads (if h has nothing yet) and answers one HELLO on an accepted control socket.
// It returns the new connection (WELCOME sent) for DIRECT mode, else nil (see handleHello).
func (l *Listener) serveHello(cfd int, h *hello) *Conn {
	cf := os.NewFile(uintptr(cfd), "colo-ctl")
	if h.err == unix.EAGAIN {
		cf.SetReadDeadline(time.Now().Add(helloTimeout))
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			select {
			case <-l.done:
				cf.SetReadDeadline(time.Now())
			case <-stop:
			}
		}()
		rc, err := cf.SyscallConn()
		if err != nil {
			cf.Close()
			return nil
		}
		// Listed as silent while it waits: claimCarrier does not wait for a client that has not
		// spoken (silent.go).
		l.markSilent(cfd)
		err = rc.Read(func(fd uintptr) bool { return l.readSilent(int(fd), h) })
		l.unmarkSilent(cfd)
		if err != nil && h.err == nil {
			h.err = err
		}
	}
	return l.handleHello(cfd, cf, h)
}

// handleHello answers a HELLO. It returns the new connection (WELCOME sent) for DIRECT mode, or
// nil once everything is answered and released (CARRIER offers wait here for their claim).
func (l *Listener) handleHello(cfd int, cf *os.File, h *hello) *Conn {
	var fds []int
	if h.oobn > 0 {
		fds = parseRights(h.oob[:h.oobn])
	}
	// Nothing after the HELLO may carry descriptors (spec section 3), and nothing may follow it
	// before our answer: what did (queued before the socket refused descriptors) is taken now,
	// its descriptors discarded (a socket's close would release them here), and the HELLO
	// refused, as the Rust listener does.
	refuseRights(cfd)
	behind := takeBehind(cfd)
	// A HELLO's offer is stored before it is counted off pending (SYNC POINT with the Load in
	// unreadHellos), and the count is lowered before offerEvent closes the channel.
	heard := sync.OnceFunc(func() { l.pending.Add(-1); l.offerEvent() })
	defer heard()
	closeAll := func() {
		for _, fd := range fds {
			discardFd(fd)
		}
		cf.Close()
	}
	if h.err != nil || (h.n == 0 && h.oobn == 0) {
		closeAll()
		return nil
	}
	m, derr := decodeMsg(h.buf[:h.n])
	switch {
	case h.flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || derr != nil || m.Type != MsgHello:
		reject(cfd, RejectBadMessage)
	case m.Version != Version:
		reject(cfd, RejectBadVersion)
	case behind > 0:
		reject(cfd, RejectBadMessage)
	case m.Arg == ModeDirect && !l.admitsDirect(cfd):
		// No TCP handshake, so no firewall rule, would see this connection: a real one must.
		logf("hello: DIRECT from another uid: a carrier is required")
		reject(cfd, RejectNeedCarrier)
	case m.recycle() && len(fds) != 0:
		reject(cfd, RejectBadMessage)
	case m.recycle():
		heard()
		c, reason := l.adoptRecycled(cfd, cf, m.Ticket)
		if c != nil || reason == 0 {
			return c
		}
		reject(cfd, reason)
	case len(fds) != 1:
		// The segment's memfd alone (spec section 3): three is an older client's doorbells.
		reject(cfd, RejectBadMessage)
	case m.Arg == ModeDirect && l.carrierOnly.Load():
		reject(cfd, RejectNeedCarrier)
	default:
		if m.Arg != ModeCarrier {
			heard()
		}
		c, reason := l.adopt(cfd, cf, m.Arg, fds, heard)
		if c != nil {
			return c
		}
		if reason == 0 {
			return nil // adopt has closed everything
		}
		reject(cfd, reason)
	}
	closeAll()
	return nil
}

// adopt validates the segment and, on success, returns the server side of the connection (the
// descriptors now belong to it; WELCOME was sent). On failure it returns the REJECT reason and
// leaves the descriptors to the caller.
func (l *Listener) adopt(cfd int, cf *os.File, mode uint8, fds []int, heard func()) (*Conn, uint8) {
	size, err := checkSegmentFd(fds[0])
	if err != nil {
		logf("hello: %v", err)
		return nil, RejectBadSegment
	}
	cred, err := peerCred(cfd)
	if err != nil {
		logf("hello: peer credentials: %v", err)
		return nil, RejectNoResources
	}
	// Counted against this process's budgets of peer segments (not mapped if it does not fit).
	seg, err := mapPeerSegment(fds[0], size, cred.Uid)
	if err != nil {
		logf("listen %v: refused a segment: %v", l.addr, err)
		return nil, RejectNoResources
	}
	h, lay, err := decodeHeader(seg[:headerSize])
	if err == nil && lay.segmentSize != size {
		err = errBadSegment
	}
	if err == nil && mode == ModeDirect && h.Claim != ClaimDirect {
		err = errBadSegment
	}
	if err == nil && mode == ModeCarrier && h.Claim != ClaimOffered {
		err = errBadSegment
	}
	if err != nil {
		logf("hello: %v", err)
		munmapSegment(seg)
		return nil, RejectBadSegment
	}
	if mode == ModeDirect && !serves(l.addr, l.v6only, h.ServerAddr) {
		// An IPv4 client of an IPV6_V6ONLY listener, which TCP would refuse too.
		logf("hello: DIRECT for %v, which this TCP socket does not serve", h.ServerAddr)
		munmapSegment(seg)
		return nil, RejectNotServed
	}
	putLE32(seg, hServerPid, uint32(os.Getpid()))
	c := &Conn{isServer: true, seg: seg, lay: lay, ctl: cf, ctlFd: cfd}
	l.setAddrs(c, h)
	c.peerPid, c.peerUID = int(cred.Pid), cred.Uid
	if mode == ModeCarrier {
		if !h.ClientAddr.IsValid() || !h.ServerAddr.IsValid() {
			munmapSegment(seg)
			return nil, RejectBadSegment
		}
		if l.netns != nil && l.netns.route(c, fds) {
			heard()
			return nil, 0
		}
		l.offerCarrier(c, h, fds, heard)
		return nil, 0
	}
	c.parkTable = l.parked
	if !l.finish(c, fds) {
		return nil, 0
	}
	return c, 0
}

// setAddrs sets a server connection's addresses from the segment header the client wrote.
func (l *Listener) setAddrs(c *Conn, h header) {
	c.laddr, c.raddr = tcpAddr(h.ServerAddr), tcpAddr(h.ClientAddr)
	if !h.ServerAddr.IsValid() {
		c.laddr = tcpAddr(l.addr)
	}
}

// adoptRecycled answers a RECYCLE HELLO (spec section 3, "Recycling"): the client took back the
// segment this listener parked under ticket. On success it returns the server side of the
// connection (WELCOME sent); on failure the REJECT reason, or 0 once everything is released.
func (l *Listener) adoptRecycled(cfd int, cf *os.File, ticket uint32) (*Conn, uint8) {
	cred, err := peerCred(cfd)
	if err != nil {
		logf("recycling hello: peer credentials: %v", err)
		return nil, RejectNoResources
	}
	p, err := l.parked.take(ticket, cred.Pid)
	if err != nil {
		logf("recycling hello from pid %d: %v", cred.Pid, err)
		return nil, RejectBadSegment
	}
	if foreignUID(cred.Uid) {
		// Parked with a client of our user (a connection read through the memfd is not parked):
		// a parked segment has no memfd to read a peer of another user through
		// (Conn.readThrough).
		logf("recycling hello from pid %d of another uid: refused", cred.Pid)
		p.release()
		return nil, RejectBadSegment
	}
	// The geometry stays the one validated when the segment was first accepted; only the
	// address records are read again (from a private copy of the header's first bytes).
	var b [lineSize]byte
	copy(b[:hParked], p.seg[:hParked])
	h, lay, err := decodeHeader(b[:])
	if err == nil && (lay.Geometry != p.lay.Geometry || h.Claim != ClaimDirect) {
		err = errBadSegment
	}
	if err != nil {
		logf("recycling hello: %v", err)
		p.release()
		return nil, RejectBadSegment
	}
	if !serves(l.addr, l.v6only, h.ServerAddr) {
		logf("recycling hello: for %v, which this TCP socket does not serve", h.ServerAddr)
		p.release()
		return nil, RejectNotServed
	}
	c := &Conn{isServer: true, seg: p.seg, lay: p.lay, ctl: cf, ctlFd: cfd, peerPid: int(cred.Pid), peerUID: cred.Uid, parkTable: l.parked}
	l.setAddrs(c, h)
	if !l.finish(c, nil) {
		return nil, 0
	}
	return c, 0
}

// finish completes an adopted connection, then sends WELCOME (before any ring of ours: spec
// section 3). On failure it closes everything (including the control socket) and reports false.
// fds are a new segment's descriptors (its memfd); none for a recycled one.
func (l *Listener) finish(c *Conn, fds []int) bool {
	c.ctl.SetReadDeadline(time.Time{})
	memfd := -1
	if len(fds) > 0 {
		memfd = fds[0]
	}
	c.setup(memfd)
	// A client that gave up waiting (its connection was pending, spec section 3) may have closed
	// already: WELCOME then fails, but the bytes in its ring are still delivered, then EOF.
	if f := l.testAnswer.Load(); f != nil && !(*f)(c) {
		reject(c.ctlFd, RejectNoResources)
		c.discard()
		return false
	}
	sendMsg(c.ctlFd, hsMsg{Type: MsgWelcome, Version: Version})
	return true
}
