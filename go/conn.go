package colo

import (
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Transport names what carries a connection's bytes.
type Transport string

const (
	TransportColo Transport = "colo" // a shared-memory segment
	TransportTCP  Transport = "tcp"  // a plain TCP connection (fallback)
)

// Conn is a connection made by Dial or accepted by a Listener. It implements net.Conn. When the
// peer is on this host and speaks colo, bytes move through a shared-memory segment; otherwise
// Conn wraps a plain *net.TCPConn. Transport tells which.
//
// The colo parts live in files of their own: the byte rings in ring.go, their growth in grow.go,
// their use by Read and Write in stream.go, the waker's side of sleep/wake in notify.go, this
// side's sleep in wait.go and bellwait.go, spinning in spin.go, deadlines in deadline.go, the
// control socket in ctl.go, closing in close.go, messages in msg.go.
type Conn struct {
	tcp *net.TCPConn // non-nil: plain TCP (fallback); of the fields below only owed's are used

	// Plain TCP across network namespaces whose server has not answered the PROPOSAL yet
	// (netns_owed.go): Read takes the answer off the stream first. Set before the Conn is
	// returned by netnsDial, cleared once under owedMu; Read's one check when plain.
	owed        atomic.Bool
	owedMu      sync.Mutex // serializes takeOwed
	owedPartial time.Time  // when the head was first seen to hold part of an answer (owedMu)

	// Identity, fixed once the connection is set up.
	laddr, raddr *net.TCPAddr
	isServer     bool
	carrier      net.Conn // CARRIER mode: the loopback TCP connection, kept open
	peerPid      int
	peerUID      uint32         // SO_PEERCRED of the control socket, or who answered where that differs (readThrough)
	welcomeName  string         // client: rendezvous name, remembered when the late WELCOME comes ("": not)
	parkName     string         // DIRECT client: the listener's rendezvous name, to park under on a clean close
	parkTable    *parkTable     // DIRECT server: the listener's parked segments, for a clean close
	shortAP      netip.AddrPort // CARRIER client: the destination whose short-lived rule its Close feeds (invalid: none)
	born         time.Time      // CARRIER client: when it was set up (with shortAP)
	setupTook    time.Duration  // CARRIER client: its wait for the server's answer (with shortAP)

	// The segment.
	seg         []byte
	lay         layout
	in, out     direction // in: peer -> us; out: us -> peer
	myWaiting   *uint32
	peerWaiting *uint32

	// The control socket, the connection's only descriptor: our doorbell (we wait on it, in the
	// netpoller, and a one-byte datagram sent on it rings the peer) and the peer's liveness.
	ctl    *os.File
	ctlFd  int // ctl's descriptor (os.File.Fd would make it blocking)
	ctlRaw syscall.RawConn
	// The control socket refuses descriptors, so none can be queued on it: a drain needs no
	// room for them (drainCtl), nor its close an emptying (Close). Every control socket is made
	// to (SO_PASSRIGHTS 0: the client's by connectRendezvous or connectRendezvousPath, the
	// server's by handleHello once the HELLO is read); the kernel does so from Linux 6.16.
	rightsOff bool

	// State shared by this side's goroutines. Each atomic's writers and readers are named at
	// its uses; what a flag set before a kick guarantees is said at kick.
	pending  atomic.Bool           // client: established before the server's answer (spec section 3); drainCtl's own
	life     sync.RWMutex          // read-held by every operation; write-held by Close to unmap
	closed   atomic.Bool           // set once by Close (before its kick); read by enter and every ready condition
	fatal    atomic.Pointer[error] // the first fatal error (fail); read by every operation
	ctlGone  atomic.Bool           // the control socket hung up (drainCtl)
	rdClosed atomic.Bool           // CloseRead (before its kick)
	wrClosed atomic.Bool           // CloseWrite; read by writeCheck
	rdl, wdl deadline
	spin     spinner

	// How this side's waiters take turns sleeping (wait.go, bellwait.go).
	waitMu     sync.Mutex
	nwait      int           // waiters counted in await (waitMu)
	polling    bool          // a waiter sleeps in the netpoller (waitMu)
	wakeCh     chan struct{} // closed when the poller wakes (waitMu)
	wakeChUsed atomic.Bool   // a non-polling waiter holds wakeCh (set and cleared under waitMu)
	lostWakes  atomic.Uint32 // bumped by a follower whose announcement found the word woken
	kicked     atomic.Bool   // kick expired the control socket's deadline; the next poll clears it
	// The poller's state (only the goroutine that set polling uses it) and callbacks made once,
	// so that waiting allocates nothing.
	pollFirst, pollOK                         bool
	pollLostWakes                             uint32 // lostWakes when this poll began
	pollCheck                                 func() bool
	pollFn                                    func(uintptr) bool
	kickFn                                    func() // c.kick, made once (deadlines take it)
	readReadyFn, writeReadyFn, loanFn, recvFn func() bool

	// The stream's ends and the message pool.
	rmu        sync.Mutex    // one reader at a time
	rx         consumer      // of the incoming ring (rmu)
	rdlErr     error         // Read's deadline error, made once (rmu)
	wmu        sync.Mutex    // one writer at a time
	tx         producer      // of the outgoing ring (wmu)
	sndLimit   atomic.Uint64 // SetWriteBuffer's bound on the ring's growth (0: none); orders nothing
	shrinkable bool          // the shrinker watches this connection (wmu)
	quietHead  uint64        // the shrinker's: ring_head at its last look (wmu)
	quietLooks int           // the shrinker's: looks in a row that found it empty at quietHead (wmu)
	pool       poolState
}

// Transport reports what carries this connection: TransportColo or TransportTCP.
func (c *Conn) Transport() Transport {
	if c.tcp != nil {
		return TransportTCP
	}
	return TransportColo
}

// TCPConn returns the underlying *net.TCPConn of a fallback connection, or nil. A connection to
// another network namespace whose server had not answered colo's proposal when Dial returned
// takes that answer off the stream in its first Read: read it through the Conn, not the
// *net.TCPConn, at least until that Read has returned bytes.
func (c *Conn) TCPConn() *net.TCPConn { return c.tcp }

// Geometry returns the segment geometry of a colo connection (zero for TCP).
func (c *Conn) Geometry() Geometry { return c.lay.Geometry }

// LocalAddr returns the local address as a *net.TCPAddr.
func (c *Conn) LocalAddr() net.Addr {
	if c.tcp != nil {
		return c.tcp.LocalAddr()
	}
	return c.laddr
}

// RemoteAddr returns the remote address as a *net.TCPAddr.
func (c *Conn) RemoteAddr() net.Addr {
	if c.tcp != nil {
		return c.tcp.RemoteAddr()
	}
	return c.raddr
}

func tcpAddr(a netip.AddrPort) *net.TCPAddr {
	if !a.IsValid() {
		return &net.TCPAddr{}
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(a.Addr().Unmap(), a.Port()))
}

func (c *Conn) opErr(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.laddr, Addr: c.raddr, Err: err}
}

func errnoErr(op string, e unix.Errno) error { return os.NewSyscallError(op, e) }

// ErrProtocol is wrapped by the error of a connection whose peer corrupted the shared segment.
var ErrProtocol = unix.EPROTO

// setup finishes a colo connection once the segment is mapped and the handshake done. It takes
// memfd, the segment's memfd (-1: none, a recycled segment's): see readThrough.
func (c *Conn) setup(memfd int) {
	c.wakeCh = make(chan struct{})
	c.readReadyFn, c.writeReadyFn, c.loanFn, c.recvFn = c.readReady, c.writeReady, c.loanReady, c.recvReady
	c.pollFn = c.pollCallback
	c.kickFn = c.kick
	// The handshake may have left a read deadline on the control socket: the first poll clears it.
	c.kicked.Store(true)
	c.spin.ns.Store(defaultSpinNs)
	if defaultSpinNs > 0 && c.peerPid > 0 && affinityUnionIsOne(c.peerPid) {
		c.spin.ns.Store(0)
	}
	if defaultSpinNs > 0 && c.peerPid == os.Getpid() && runtime.GOMAXPROCS(0) == 1 {
		// The peer is in this process, which runs one goroutine at a time: it cannot make
		// progress while we spin.
		c.spin.ns.Store(0)
	}
	l := c.lay
	c2s := newDirection(c.seg, l, headerSize)
	s2c := newDirection(c.seg, l, headerSize+l.blockSize)
	cw, sw := u32at(c.seg, hClientWaiting), u32at(c.seg, hServerWaiting)
	if c.isServer {
		c.in, c.out, c.myWaiting, c.peerWaiting = c2s, s2c, sw, cw
	} else {
		c.in, c.out, c.myWaiting, c.peerWaiting = s2c, c2s, cw, sw
	}
	c.readThrough(memfd)
	c.tx.start(&c.out, uint64(l.RingCapacity))
	c.rx.size = min(minRingSize, uint64(l.RingCapacity))
	c.pool.init(l.SlotCount)
	// The control socket, our doorbell, sits directly in the netpoller (edge-triggered: every
	// datagram that arrives, and the hang-up, is an event): it is the readiness fd of spec
	// section 6, without a nested epoll instance. It is non-blocking since its socket(2) or
	// accept4(2), so os.NewFile registered it.
	c.ctlRaw, _ = c.ctl.SyscallConn()
	c.rightsOff = passRightsKnown()
}

// foreignUID reports whether a peer of uid uid is another user. A peer in another user namespace
// whose uid has no mapping in ours is reported as the overflow uid, another user too (unless we
// run as it).
func foreignUID(uid uint32) bool { return uid != uint32(os.Getuid()) }

// readThrough has the incoming ring read with pread of the segment's memfd (direction.loadFile)
// when the peer is another user (peerUID), and keeps memfd open for it until Close; otherwise
// it closes memfd (the mapping keeps the segment). A page of the ring the peer never wrote (a
// hole: bytes it claimed and never wrote) is allocated by whoever first touches it through a
// mapping, charged to that process's memory cgroup for as long as the memfd lives, and the peer
// keeps it; a read of the file gives zeros and allocates nothing. A peer of our own user could
// make us hold memory by allocating it itself, so its reads stay a copy from the mapping,
// without a system call. A recycled segment comes without its memfd: it is recycled only
// between peers of one user (Close, prepareClient, adoptRecycled).
func (c *Conn) readThrough(memfd int) {
	if memfd < 0 {
		return
	}
	if !foreignUID(c.peerUID) {
		unix.Close(memfd)
		return
	}
	c.in.file, c.in.fileOff = memfd, c.in.base+c.lay.dataOff
}

// closeMemfd closes the memfd readThrough kept (once no operation can read the ring).
func (c *Conn) closeMemfd() {
	if c.in.file >= 0 {
		unix.Close(c.in.file)
		c.in.file = -1
	}
}

// enter marks the start of an operation; it fails once Close has begun.
func (c *Conn) enter() bool {
	c.life.RLock()
	// SYNC POINT with the CompareAndSwap in Close, which then waits for the life lock: an
	// operation that enters after it sees closed, one that entered before holds Close off.
	if c.closed.Load() {
		c.life.RUnlock()
		return false
	}
	return true
}

func (c *Conn) exit() { c.life.RUnlock() }

func (c *Conn) fatalErr() error {
	if p := c.fatal.Load(); p != nil {
		return *p
	}
	return nil
}

// fail records a fatal error; with reset, it sets RESET on our direction and wakes the peer.
func (c *Conn) fail(err error, reset bool) error {
	// SYNC POINT with the Loads of fatal in fatalErr and the ready conditions: the first error
	// wins, and every operation of this side returns it from then on.
	c.fatal.CompareAndSwap(nil, &err)
	if reset {
		// SYNC POINT with the peer's loads of our ring_flags (its readSome and writeCheck).
		atomic.OrUint32(c.out.flags, flagRESET)
		c.alertPeer()
	}
	return *c.fatal.Load()
}

func (c *Conn) corrupt(what string) error {
	return c.fail(&ProtocolError{What: what}, true)
}

// ProtocolError reports corruption seen in the shared segment (EPROTO). The connection is reset.
type ProtocolError struct{ What string }

func (e *ProtocolError) Error() string        { return "colo: protocol error: " + e.What }
func (e *ProtocolError) Unwrap() error        { return unix.EPROTO }
func (e *ProtocolError) Is(target error) bool { return target == unix.EPROTO }
