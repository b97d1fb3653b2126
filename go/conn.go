package colo

import (
	"errors"
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
type Conn struct {
	tcp *net.TCPConn // non-nil: plain TCP (fallback); nothing below is used

	laddr, raddr *net.TCPAddr
	isServer     bool
	carrier      net.Conn // CARRIER mode: the loopback TCP connection, kept open

	seg         []byte
	lay         layout
	in, out     direction // in: peer -> us; out: us -> peer
	myWaiting   *uint32
	peerWaiting *uint32
	ownBell     int // our end of the doorbell pair: we wait on it, and a byte sent on it rings the peer
	spareBell   int // server: the HELLO's second descriptor of ownBell, closed with it; client: -1
	ctl         *os.File
	ctlFd       int
	bell        *os.File // our doorbell (ownBell), in the netpoller
	bellRaw     syscall.RawConn
	peerPid     int
	pending     atomic.Bool // client: established before the server's answer (spec section 3)
	welcomeName string      // client: rendezvous name, remembered when the late WELCOME comes
	parkName    string      // DIRECT client: the listener's rendezvous name, to park under on a clean close
	parkTable   *parkTable  // DIRECT server: the listener's parked segments, for a clean close
	spin        spinner
	life        sync.RWMutex // read-held by every operation; write-held by Close to unmap
	closed      atomic.Bool
	fatal       atomic.Pointer[error]
	ctlGone     atomic.Bool
	rdClosed    atomic.Bool
	wrClosed    atomic.Bool
	rdl, wdl    deadline
	waitMu      sync.Mutex
	nwait       int
	polling     bool
	wakeCh      chan struct{} // closed when the poller wakes (waitMu)
	wakeChUsed  atomic.Bool   // a non-polling waiter holds wakeCh (set and cleared under waitMu)
	lostWakes   atomic.Uint32 // bumped by a follower whose announcement found the word woken
	kicked      atomic.Bool   // kick expired the doorbell's deadline; the next poll clears it
	bellDirty   atomic.Bool   // the doorbell may hold rings no netpoller event will report (see pollOnce)
	// The poller's state (only the goroutine that set polling uses it) and callbacks made once,
	// so that waiting allocates nothing.
	pollFirst, pollOK                         bool
	pollLostWakes                             uint32 // lostWakes when this poll began
	pollCheck                                 func() bool
	pollFn                                    func(uintptr) bool
	kickFn                                    func() // c.kick, made once (deadlines take it)
	readReadyFn, writeReadyFn, loanFn, recvFn func() bool
	rmu                                       sync.Mutex // one reader at a time
	tail, cHead                               uint64     // consumer state (rmu)
	rdlErr                                    error      // Read's deadline error, made once (rmu)
	wmu                                       sync.Mutex // one writer at a time
	head, cTail                               uint64     // producer state (wmu)
	pool                                      poolState
}

// direction addresses one direction block of the segment.
type direction struct {
	base                                             uint64
	head, tail, msgHead, msgTail, freeHead, freeTail *uint64
	flags, rflags                                    *uint32
	data                                             []byte
	msgEnt, freeEnt                                  []byte
	pool                                             []byte
}

func newDirection(seg []byte, l layout, base uint64) direction {
	d := direction{base: base}
	d.head = u64at(seg, base+dRingHead)
	d.flags = u32at(seg, base+dRingFlags)
	d.tail = u64at(seg, base+dRingTail)
	d.rflags = u32at(seg, base+dReadFlags)
	d.msgHead = u64at(seg, base+dMsgHead)
	d.msgTail = u64at(seg, base+dMsgTail)
	d.freeHead = u64at(seg, base+dFreeHead)
	d.freeTail = u64at(seg, base+dFreeTail)
	n := uint64(l.SlotCount)
	d.msgEnt = seg[base+dMsgEnt : base+dMsgEnt+8*n : base+dMsgEnt+8*n]
	fo := base + l.freeOff()
	d.freeEnt = seg[fo : fo+4*n : fo+4*n]
	d.data = seg[base+l.dataOff : base+l.poolOff : base+l.poolOff]
	pe := base + l.poolOff + n*uint64(l.SlotSize)
	d.pool = seg[base+l.poolOff : pe : pe]
	return d
}

type deadline struct {
	mu    sync.Mutex
	t     atomic.Int64 // UnixNano; 0 means none
	timer *time.Timer
}

func (d *deadline) set(t time.Time, kick func()) {
	if t.IsZero() && d.t.Load() == 0 {
		// Nothing to remove (net/http clears deadlines several times per request): without a
		// deadline there is no timer either, as a timer is made only with a deadline and
		// removed with it. Partner: the stores below, made under mu.
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	old := d.t.Load()
	if t.IsZero() {
		d.t.Store(0)
		return // a removed deadline needs no wake-up
	}
	nt := t.UnixNano()
	d.t.Store(nt)
	if dur := time.Until(t); dur > 0 {
		d.timer = time.AfterFunc(dur, kick)
	}
	if old == 0 || nt < old {
		kick() // blocked operations re-evaluate their deadline
	}
}

func (d *deadline) stop() {
	d.mu.Lock()
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	d.mu.Unlock()
}

func (d *deadline) expired() bool {
	t := d.t.Load()
	return t != 0 && time.Now().UnixNano() >= t
}

// spinner is the local spin policy of spec section 9.
type spinner struct {
	ns    atomic.Int64 // <0: spin only; 0: never spin
	fails atomic.Int32
	skips atomic.Uint32
}

var defaultSpinNs = func() int64 {
	v := os.Getenv("COLO_SPIN_US")
	switch v {
	case "":
		return 5000
	case "inf", "-1":
		return -1
	}
	var us int64
	for _, ch := range v {
		if ch < '0' || ch > '9' {
			return 5000
		}
		us = us*10 + int64(ch-'0')
	}
	return us * 1000
}()

// try spins until ready() or the spin budget is spent; it reports whether ready() held.
// Adaptive (spec section 9): after 8 spins in a row that ended in sleep, a side spins only once
// in 16 waits, for 4 times the budget, until a spin succeeds again. The longer probe lets two
// sides that both sleep (a ping-pong in which every answer takes a wake-up, longer than the
// budget) discover that spinning pays: the prober catches the sleeper's answer, spins again, and
// the other side's next probe then succeeds at once.
func (s *spinner) try(ready func() bool, interrupted func() bool) bool {
	ns := s.ns.Load()
	if ns == 0 {
		return false
	}
	if ns > 0 && cpusCrowded() {
		return false // threads wait for a CPU: spinning would hold off the one we wait for
	}
	budget := ns
	if ns > 0 && s.fails.Load() >= 8 {
		if s.skips.Add(1)%16 != 0 {
			return false
		}
		budget = 4 * ns
	}
	start := nanotime()
	yielded := start
	for i := 1; ; i++ {
		if ready() {
			if !interrupted() { // a deadline or Close is no evidence that spinning pays
				s.fails.Store(0)
			}
			return true
		}
		if i%16 == 0 {
			now := nanotime()
			if budget > 0 && now-start > budget {
				if s.fails.Load() < 1000 {
					s.fails.Add(1)
				}
				return false
			}
			// Let other goroutines of this process run: a spin must not delay the work
			// that would make our condition true (in-process peers, handlers). Not on every
			// round: runtime.Gosched wakes an idle P's thread (a futex system call, and on a
			// small host a thread that competes with the peer's), which every 16 rounds cost
			// more than the spin saved.
			if now-yielded >= spinYieldNs {
				runtime.Gosched()
				yielded = nanotime()
			}
		}
	}
}

// cpusCrowded is asked before every adaptive spin (a variable so that tests can fix the answer).
var cpusCrowded = cpusOversubscribed

// spinYieldNs is how long a spin runs between two yields to the goroutines of this process.
const spinYieldNs = 2000

var monoBase = time.Now()

func nanotime() int64 { return int64(time.Since(monoBase)) }

// Transport reports what carries this connection: TransportColo or TransportTCP.
func (c *Conn) Transport() Transport {
	if c.tcp != nil {
		return TransportTCP
	}
	return TransportColo
}

// SetSpin sets how long this side spins, re-checking the ring, before it sleeps on its doorbell
// (spec/WIRE.md section 9). 0 never spins; d > 0 spins up to d (adaptively: a side whose spins
// keep ending in sleep mostly stops spinning); d < 0 spins and never sleeps (busy polling, which
// costs a CPU while waiting). The default comes from COLO_SPIN_US ("inf" or -1 for busy polling),
// else 5us, or no spin when the two processes share a single CPU. No effect on TCP connections.
func (c *Conn) SetSpin(d time.Duration) {
	if c.tcp != nil {
		return
	}
	if d < 0 {
		d = -1
	}
	c.spin.fails.Store(0)
	c.spin.ns.Store(int64(d))
}

// TCPConn returns the underlying *net.TCPConn of a fallback connection, or nil.
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

// setup finishes a colo connection once the segment is mapped and the handshake done.
func (c *Conn) setup() error {
	c.wakeCh = make(chan struct{})
	c.readReadyFn, c.writeReadyFn, c.loanFn, c.recvFn = c.readReady, c.writeReady, c.loanReady, c.recvReady
	c.pollFn = c.pollCallback
	c.kickFn = c.kick
	// A recycled doorbell may still carry the deadline of its previous connection's last kick.
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
	c.pool.init(l.SlotCount)
	// Our doorbell sits directly in the netpoller (edge-triggered: every write is an event) and
	// a parked goroutine watches the control socket; together they are the readiness fd of
	// spec section 6, without a nested epoll instance or any system call in the wait path. A
	// recycled segment comes with its doorbell already there.
	if c.bell == nil {
		if err := unix.SetNonblock(c.ownBell, true); err != nil {
			return err
		}
		c.bell = os.NewFile(uintptr(c.ownBell), "colo-doorbell")
	}
	c.bellRaw, _ = c.bell.SyscallConn()
	return nil
}

// enter marks the start of an operation; it fails once Close has begun.
func (c *Conn) enter() bool {
	c.life.RLock()
	if c.closed.Load() {
		c.life.RUnlock()
		return false
	}
	return true
}

func (c *Conn) exit() { c.life.RUnlock() }

// kick wakes the operation sleeping in the netpoller (if any) so that every blocked operation
// re-checks its state. It expires the doorbell file's own deadline, which the runtime handles
// without a system call; the poller clears it before each sleep, after which its re-check sees
// whatever state change the kick announces.
//
// Only a goroutine counted in nwait can sleep: one that spins re-checks its condition anyway.
// The caller changed the state before calling kick, and a waiter counts itself under waitMu
// before the re-check that precedes its sleep, so a waiter we do not see here sees the change.
// (net/http's server aborts its background read after every request, mostly before that read
// has even started waiting.)
func (c *Conn) kick() {
	c.waitMu.Lock()
	n := c.nwait
	c.waitMu.Unlock()
	if n == 0 {
		return
	}
	c.bell.SetReadDeadline(aLongTimeAgo)
	c.kicked.Store(true) // after the deadline; partner: the Swap in pollOnce
}

var aLongTimeAgo = time.Unix(1, 0)

func (c *Conn) fatalErr() error {
	if p := c.fatal.Load(); p != nil {
		return *p
	}
	return nil
}

// fail records a fatal error; with reset, it sets RESET on our direction and wakes the peer.
func (c *Conn) fail(err error, reset bool) error {
	c.fatal.CompareAndSwap(nil, &err)
	if reset {
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

// Bits of a waiting word (spec section 6): how that side sleeps.
const (
	waitDoorbell = 1 // on its doorbell (the only way this package sleeps)
	waitFutex    = 2 // on a shared futex at the waiting word itself
)

// notifyPeer is called after every store the peer may wait for (spec section 6): it exchanges
// the peer's waiting word to 0 and wakes the peer the way each returned bit says. Every write of
// a waiting word, ours and the peer's, is an atomic read-modify-write, so that either this
// exchange returns the sleeper's bit, or the sleeper's OR comes later and its re-check sees our
// progress (Go's atomics are moreover sequentially consistent).
func (c *Conn) notifyPeer() {
	if w := atomic.SwapUint32(c.peerWaiting, 0); w != 0 {
		c.wakePeer(w)
	}
}

// notifySpace is notifyPeer after the consumer moved ring_tail from old (its new value already
// stored). A producer waits for space only when it found the ring full (every implementation:
// Go's Write, Rust's write and the shim's EPOLLOUT, which like Linux TCP reports no new
// writability edge for a ring that was not full), so the peer's waiting word is only worth an
// exchange, and the doorbell a system call, when the ring may have been full at old. Without
// this, every read of a request woke the peer's reader, which waits for the answer, not for
// space: one useless ring and wake-up per message in a request/response exchange.
//
// Why no wake-up is lost: a producer that sleeps stored its head H, then ORed its waiting bit,
// then re-read ring_tail and still found H - tail == capacity. Our store of the new tail comes
// after that re-read (else the producer would have seen it), so every head store before the
// re-read, H included, precedes the load below: it returns at least H. Whichever tail the
// re-read returned is old (our previous store) or older; for an older one, the consumption that
// stored old already found the ring full and exchanged the word after the producer's OR. So
// the first consumption after a producer's re-check sees head - old >= capacity and wakes it.
// The store above and the load below are sequentially consistent (Go's atomics), and the
// producer's OR is a full barrier between its head store and its tail re-read on every
// architecture Go and the Rust core support (a locked instruction on x86, an acquire-release
// read-modify-write followed by an acquire load on arm64).
func (c *Conn) notifySpace(old uint64) {
	// Acquire load; partner: the producer's release store of ring_head.
	if atomic.LoadUint64(c.in.head)-old >= uint64(c.lay.RingCapacity) {
		c.notifyPeer()
	}
}

// wakePeer wakes the peer for the waiting bits w.
func (c *Conn) wakePeer(w uint32) {
	if w&waitFutex != 0 {
		futexWake(c.peerWaiting)
	}
	// Bits 8 and up are the sleeper's announcement sequence (spec section 6): not a way to sleep.
	if w&waitDoorbell != 0 {
		ringBell(c.ownBell)
	}
}

// alertPeer wakes the peer after closing or resetting, which are progress like any other (spec
// section 6): the exchange wakes a peer that announced a sleep (one that announced a futex sleep
// but has not entered it finds its word changed), and a peer that announces later sees the flag
// in its re-check. A close wakes no one who is not asleep.
func (c *Conn) alertPeer() {
	c.wakePeer(atomic.SwapUint32(c.peerWaiting, 0))
}

// await blocks until ready() holds. ready must include every reason to wake: data, space,
// flags, control-socket hang-up, close, deadline. Spec section 6: spin; exchange waiting to 1;
// re-check; sleep on the doorbell. The flag is cleared (by exchange) only when no other
// goroutine of this side still waits on it.
func (c *Conn) await(ready func() bool, dl *deadline) {
	if c.spin.try(ready, func() bool { return c.closed.Load() || dl.expired() }) {
		return
	}
	c.waitMu.Lock()
	c.nwait++
	c.waitMu.Unlock()
	for !c.block(ready) && !ready() { // woken: re-check before polling again
	}
	c.waitMu.Lock()
	c.nwait--
	if c.nwait == 0 {
		atomic.AndUint32(c.myWaiting, ^uint32(waitDoorbell))
	}
	c.waitMu.Unlock()
}

// block exchanges waiting to 1, re-checks ready() and, if it does not hold, sleeps once. It reports
// whether ready() was seen to hold. Only one waiter (the poller) sleeps in the netpoller; the
// others wait for it to wake up and then re-check. A sleeping poller wakes on any event, so that
// the others get to re-check their own conditions.
//
// A waiter that announced (set its bit) may lose its wake-up before the poller sleeps: the
// peer's exchange takes the bit and rings the doorbell before the runtime resets the doorbell's
// readiness for the poller's wait, which then never sees that ring. So an announcement that
// finds the word without a sleep bit (a wake-up took them) ends the round, whatever the
// announcer's own re-check finds: the poller's own ends its poll when followers wait, a
// follower's bumps lostWakes, which the poller checks in its re-check, and kicks a poller
// already asleep. (An upload whose writer waited for space while a reader goroutine waited for
// the response hung so, when a test hook widened the window.)
func (c *Conn) block(ready func() bool) bool {
	c.waitMu.Lock()
	if c.polling {
		ch := c.wakeCh
		c.wakeChUsed.Store(true)
		c.waitMu.Unlock()
		// Read-modify-write of our waiting word (spec section 6); partner: the peer's exchange
		// in its notify.
		old := atomic.OrUint32(c.myWaiting, waitDoorbell)
		c.bellDirty.Store(true) // the peer may ring while nobody polls
		if old&(waitDoorbell|waitFutex) == 0 {
			// Whatever our re-check finds: another follower may have lost its wake-up.
			c.lostWakes.Add(1) // before the kick; partner: the Load in pollCallback
			c.kick()
		}
		if ready() {
			return true
		}
		<-ch
		return false
	}
	c.polling = true
	c.pollLostWakes = c.lostWakes.Load() // under waitMu: before any follower of this round
	c.waitMu.Unlock()
	if hook := testHookBeforePoll.Load(); hook != nil {
		(*hook)()
	}
	ok := c.pollOnce(ready)
	c.waitMu.Lock()
	c.polling = false
	if c.wakeChUsed.Load() { // else nobody waited on it: it stays good for the next poll
		close(c.wakeCh)
		c.wakeCh = make(chan struct{})
		c.wakeChUsed.Store(false)
	}
	c.waitMu.Unlock()
	return ok
}

// testHookBeforePoll, when set by a test, runs between a poller's taking its turn and its poll:
// it widens the window in which a follower's wake-up can be lost (see block).
var testHookBeforePoll atomic.Pointer[func()]

// startWatch starts the control-socket watcher; call once the connection is fully set up.
func (c *Conn) startWatch() { go c.watchCtl() }

// watchCtl waits, parked in the netpoller, for the control socket to become readable after the
// handshake: hang-up is the peer's close or death; any byte or descriptor is a protocol
// violation (reset), except the server's answer to a pending client (spec section 3): a late
// WELCOME changes nothing, a late REJECT fails the connection with ECONNREFUSED. Blocked
// operations are woken. It returns when Close closes the socket.
func (c *Conn) watchCtl() {
	rc, err := c.ctl.SyscallConn()
	if err != nil {
		return
	}
	for {
		var buf [64]byte
		var n, oobn int
		var rerr error
		err = rc.Read(func(fd uintptr) bool {
			oob := make([]byte, unix.CmsgSpace(4*8))
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf[:], oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
			if oobn > 0 {
				closeRights(oob[:oobn])
			}
			return rerr != unix.EAGAIN && rerr != unix.EINTR
		})
		if err != nil {
			return // closed by Close
		}
		if rerr == nil && oobn == 0 && n > 0 && c.pending.Load() {
			c.pending.Store(false)
			if m, derr := decodeMsg(buf[:n]); derr == nil {
				if m.Type == MsgWelcome && m.Version == Version {
					welcomed.Store(c.welcomeName, int32(c.peerPid))
					continue
				}
				if m.Type == MsgReject && c.enter() {
					logf("late %v", &RejectError{Reason: m.Arg, Version: m.Version})
					c.fail(errnoErr("read", unix.ECONNREFUSED), true)
					c.exit()
					break
				}
			}
		}
		if rerr == nil && (n > 0 || oobn > 0) && c.enter() {
			c.fail(errnoErr("read", unix.ECONNRESET), true)
			c.exit()
		}
		break // n == 0: hang-up (or an empty datagram, treated alike); other errors too
	}
	c.ctlGone.Store(true)
	c.kick()
}

// ---- stream API ----

// Read reads up to len(p) bytes. It implements net.Conn.
func (c *Conn) Read(p []byte) (int, error) {
	if c.tcp != nil {
		return c.tcp.Read(p)
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if !c.enter() {
		return 0, c.opErr("read", net.ErrClosed)
	}
	defer c.exit()
	for {
		if c.rdl.expired() {
			// One error value per connection: net/http's server ends a background read
			// with an expired deadline after every request.
			if c.rdlErr == nil {
				c.rdlErr = c.opErr("read", os.ErrDeadlineExceeded)
			}
			return 0, c.rdlErr
		}
		n, err, done := c.readSome(p)
		if done {
			return n, c.opErr("read", err)
		}
		c.await(c.readReadyFn, &c.rdl)
		if c.closed.Load() {
			return 0, c.opErr("read", net.ErrClosed)
		}
	}
}

func (c *Conn) readReady() bool {
	return c.closed.Load() || c.rdl.expired() || c.ctlGone.Load() || c.rdClosed.Load() ||
		c.fatal.Load() != nil || atomic.LoadUint64(c.in.head) != c.tail || readFlagsSet(c.in.flags)
}

// readFlagsSet reports whether the incoming ring's flags end or break a read: every bit but
// NOT_READING (which concerns our writes; a reader woken by it would spin, as it stays set).
func readFlagsSet(flags *uint32) bool {
	return atomic.LoadUint32(flags)&^flagNotReading != 0
}

// readSome copies available bytes; done is false when the caller must wait.
func (c *Conn) readSome(p []byte) (n int, err error, done bool) {
	if err := c.fatalErr(); err != nil {
		return 0, err, true
	}
	if c.rdClosed.Load() {
		return 0, io.EOF, true
	}
	capy := uint64(c.lay.RingCapacity)
	avail := c.cHead - c.tail
	if avail == 0 {
		fl := atomic.LoadUint32(c.in.flags)
		if fl&^ringFlags != 0 {
			return 0, c.corrupt("unknown ring flags"), true
		}
		if fl&flagRESET != 0 {
			return 0, c.fail(errnoErr("read", unix.ECONNRESET), false), true
		}
		h := atomic.LoadUint64(c.in.head)
		if h-c.tail > capy || h-c.cHead > capy {
			return 0, c.corrupt("ring head out of range"), true
		}
		c.cHead = h
		avail = h - c.tail
		if avail == 0 {
			if fl&flagFIN != 0 {
				return 0, io.EOF, true
			}
			if c.ctlGone.Load() {
				// Re-read after seeing the hang-up: FIN and data precede it.
				fl = atomic.LoadUint32(c.in.flags)
				if atomic.LoadUint64(c.in.head) != c.tail {
					return 0, nil, false
				}
				if fl&flagFIN != 0 {
					return 0, io.EOF, true
				}
				return 0, c.fail(errnoErr("read", unix.ECONNRESET), false), true
			}
			if len(p) == 0 {
				return 0, nil, true
			}
			return 0, nil, false
		}
	}
	if len(p) == 0 {
		return 0, nil, true
	}
	if avail > uint64(len(p)) {
		avail = uint64(len(p))
	}
	off := c.tail & (capy - 1)
	first := min(avail, capy-off)
	copy(p, c.in.data[off:off+first])
	copy(p[first:avail], c.in.data[:avail-first])
	old := c.tail
	c.tail += avail
	// Release store; partner: the producer's acquire load of ring_tail (its space check).
	atomic.StoreUint64(c.in.tail, c.tail)
	c.notifySpace(old)
	return int(avail), nil, true
}

// Write writes all of p unless an error occurs. It implements net.Conn.
func (c *Conn) Write(p []byte) (int, error) {
	if c.tcp != nil {
		return c.tcp.Write(p)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.enter() {
		return 0, c.opErr("write", net.ErrClosed)
	}
	defer c.exit()
	capy := uint64(c.lay.RingCapacity)
	written := 0
	for {
		if written == len(p) && written > 0 {
			return written, nil // done: a peer that closed after reading it all is no error
		}
		if err := c.writeCheck(); err != nil {
			return written, c.opErr("write", err)
		}
		if len(p) == 0 {
			return 0, nil
		}
		used := c.head - c.cTail
		if used == capy {
			t := atomic.LoadUint64(c.out.tail)
			if c.head-t > capy || t-c.cTail > capy {
				return written, c.opErr("write", c.corrupt("ring tail out of range"))
			}
			c.cTail = t
			used = c.head - t
			if used == capy {
				c.await(c.writeReadyFn, &c.wdl)
				continue
			}
		}
		n := min(capy-used, uint64(len(p)-written), maxPublishChunk)
		off := c.head & (capy - 1)
		first := min(n, capy-off)
		src := p[written : written+int(n)]
		copy(c.out.data[off:off+first], src)
		copy(c.out.data[:n-first], src[first:])
		c.head += n
		atomic.StoreUint64(c.out.head, c.head)
		c.notifyPeer()
		written += int(n)
	}
}

func (c *Conn) writeCheck() error {
	if c.closed.Load() {
		return net.ErrClosed
	}
	if err := c.fatalErr(); err != nil {
		return err
	}
	if c.wdl.expired() {
		return os.ErrDeadlineExceeded
	}
	if c.wrClosed.Load() {
		return errnoErr("write", unix.EPIPE)
	}
	fl := atomic.LoadUint32(c.in.flags)
	if fl&^ringFlags != 0 {
		return c.corrupt("unknown ring flags")
	}
	if fl&flagRESET != 0 {
		return c.fail(errnoErr("write", unix.ECONNRESET), false)
	}
	// The peer stopped reading: seen in its own ring's flags, not in our ring's read_flags.
	if fl&flagNotReading != 0 || c.ctlGone.Load() {
		return errnoErr("write", unix.EPIPE)
	}
	return nil
}

func (c *Conn) writeReady() bool {
	return c.closed.Load() || c.wdl.expired() || c.ctlGone.Load() || c.fatal.Load() != nil ||
		atomic.LoadUint64(c.out.tail) != c.cTail || atomic.LoadUint32(c.in.flags)&(flagRESET|flagNotReading) != 0
}

// CloseWrite shuts down the writing side (FIN): the peer reads the remaining bytes, then EOF.
func (c *Conn) CloseWrite() error {
	if c.tcp != nil {
		return c.tcp.CloseWrite()
	}
	if !c.enter() {
		return c.opErr("close", net.ErrClosed)
	}
	defer c.exit()
	c.wrClosed.Store(true)
	atomic.OrUint32(c.out.flags, flagFIN)
	c.alertPeer()
	return nil
}

// CloseRead shuts down the reading side: our reads return EOF and the peer's writes fail (EPIPE):
// READ_CLOSED in the peer's ring, NOT_READING in ours (spec section 8).
func (c *Conn) CloseRead() error {
	if c.tcp != nil {
		return c.tcp.CloseRead()
	}
	if !c.enter() {
		return c.opErr("close", net.ErrClosed)
	}
	defer c.exit()
	c.rdClosed.Store(true)
	atomic.OrUint32(c.in.rflags, flagReadClosed)
	atomic.OrUint32(c.out.flags, flagNotReading)
	c.alertPeer()
	c.kick()
	return nil
}

// Close closes the connection: FIN and NOT_READING on our direction, READ_CLOSED on the peer's, a
// ring of the peer's doorbell, then every descriptor and the mapping are released (a DIRECT
// connection that closes cleanly keeps its segment and doorbells for a while, for the next
// connection between the same two processes: spec section 3, "Recycling"). Blocked operations
// return. Message views obtained from Recv and buffers from Loan must not be used after Close.
func (c *Conn) Close() error {
	if c.tcp != nil {
		return c.tcp.Close()
	}
	if !c.closed.CompareAndSwap(false, true) {
		return c.opErr("close", net.ErrClosed)
	}
	c.kick() // wake blocked operations; they see closed and leave
	c.life.Lock()
	defer c.life.Unlock()
	c.rdl.stop()
	c.wdl.stop()
	atomic.OrUint32(c.in.rflags, flagReadClosed)
	atomic.OrUint32(c.out.flags, flagFIN|flagNotReading)
	c.alertPeer()
	clean := c.cleanClose() // our last use of the segment
	c.ctl.Close()           // the control-socket watcher returns
	if clean && c.carrier == nil {
		switch {
		case c.parkName != "":
			parkClient(c.parkName, c.peerPid, parkOf(c))
			c.seg = nil
			return nil
		case c.parkTable != nil && c.peerPid > 0:
			c.parkTable.park(int32(c.peerPid), parkOf(c))
			c.seg = nil
			return nil
		}
	}
	c.bell.Close() // closes ownBell
	unix.Close(c.spareBell)
	if c.carrier != nil {
		if debug {
			if rc, err := c.carrier.(*net.TCPConn).SyscallConn(); err == nil {
				rc.Control(func(fd uintptr) {
					n, _ := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
					if n > 0 { // a CARRIER peer must never send payload on the TCP connection
						logf("close: %d bytes were sent on the carrier TCP connection", n)
					}
				})
			}
		}
		c.carrier.Close()
	}
	unmapLater(c.seg)
	c.seg = nil
	return nil
}

// cleanClose reports whether this side may park the segment on Close (spec section 3,
// "Recycling"): no reset sent or seen, no corruption, no refused HELLO, and a peer that did not
// die (a hang-up without FIN).
func (c *Conn) cleanClose() bool {
	if c.fatal.Load() != nil {
		return false
	}
	// The hang-up first: a peer's FIN precedes its hang-up.
	gone := c.ctlGone.Load()
	// Acquire loads; partners: the peer's ORs of its flags (FIN, RESET, READ_CLOSED) and ours
	// (fail's RESET, made by any of our goroutines).
	in, out := atomic.LoadUint32(c.in.flags), atomic.LoadUint32(c.out.flags)
	rin, rout := atomic.LoadUint32(c.in.rflags), atomic.LoadUint32(c.out.rflags)
	closing := uint32(flagFIN | flagNotReading)
	return in&^closing == 0 && out&^closing == 0 && rin&^flagReadClosed == 0 &&
		rout&^flagReadClosed == 0 && (!gone || in&flagFIN != 0)
}

// unmapLater hands a segment mapping to a background goroutine. munmap of a shared mapping in a
// multi-threaded process costs TLB shoot-downs on every CPU the process ran on; doing it off the
// caller's path keeps Close (and so short-lived connections) cheap. Nothing touches the mapping
// after Close: every operation has left (Close holds the life lock exclusively).
func unmapLater(seg []byte) {
	unmapOnce.Do(func() {
		unmapQueue = make(chan []byte, 1024)
		go func() {
			for seg := range unmapQueue {
				munmapSegment(seg)
			}
		}()
	})
	select {
	case unmapQueue <- seg:
	default:
		munmapSegment(seg) // the reaper is behind: do it here
	}
}

var (
	unmapOnce  sync.Once
	unmapQueue chan []byte
)

// discard releases a server-side connection that was refused after its segment was mapped:
// unlike Close it leaves the segment untouched (no FIN), so that the client sees the REJECT.
func (c *Conn) discard() {
	c.closed.Store(true)
	c.bell.Close()
	c.ctl.Close()
	unix.Close(c.spareBell)
	unmapLater(c.seg)
	c.seg = nil
}

// SetDeadline sets the read and write deadlines. Blocked operations see the new deadline.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.tcp != nil {
		return c.tcp.SetDeadline(t)
	}
	if c.closed.Load() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdl.set(t, c.kickFn)
	c.wdl.set(t, c.kickFn)
	return nil
}

// SetReadDeadline sets the read deadline (reads and Recv).
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.tcp != nil {
		return c.tcp.SetReadDeadline(t)
	}
	if c.closed.Load() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdl.set(t, c.kickFn)
	return nil
}

// SetWriteDeadline sets the write deadline (writes and Loan).
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.tcp != nil {
		return c.tcp.SetWriteDeadline(t)
	}
	if c.closed.Load() {
		return c.opErr("set", net.ErrClosed)
	}
	c.wdl.set(t, c.kickFn)
	return nil
}

var errNoPool = errors.New("colo: connection has no message pool")
