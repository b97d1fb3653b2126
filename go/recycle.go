package colo

// Recycling segments between the same two processes (spec/WIRE.md section 3, "Recycling").
//
// Creating, passing, mapping and unmapping a segment is most of what a short-lived connection
// costs. So a side that closes a clean DIRECT connection parks the mapping (not the control
// socket, which is the connection's doorbell: the next connection has its own) instead of
// releasing it, and sets its bit in the header's parked word. The next dial from
// this process to the same listener takes back a segment both sides parked (a compare-and-swap
// of parked from both bits to 0), resets it and sends a descriptor-less HELLO naming the server's
// ticket. Parked segments are bounded (parkClientMax per process, parkServerMax per listener)
// and held at most parkIdle; a sweeper goroutine, which exists only while something is parked,
// releases the rest.

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// parkIdle is how long a side keeps a parked segment.
	parkIdle = time.Second
	// parkClientMax bounds the segments a client process keeps parked.
	parkClientMax = 4
	// parkServerMax bounds the segments a listener keeps parked.
	parkServerMax = 8
	// parkReservedMax bounds how long a server keeps an entry its client took back, for the
	// HELLO that names it.
	parkReservedMax = 10 * time.Second
)

// parked is what one side keeps of a DIRECT connection that closed cleanly: the mapping and the
// private copy of its geometry (validated when the segment was first accepted).
type parked struct {
	seg []byte
	lay layout
	// giveBack is the part of seg given back when it is released (Conn.incomingPages).
	giveBack []byte
	since    time.Time
}

func (p *parked) word() *uint32 { return u32at(p.seg, hParked) }

// release unmaps the segment (off the caller's path).
func (p *parked) release() {
	unmapAfter(p.seg, p.giveBack)
	p.seg = nil
}

func releaseAll(ps []*parked) {
	for _, p := range ps {
		p.release()
	}
}

// withdraw is the server's letting go: it clears SERVER_PARKED and reports whether it was set.
// False means the client already took the segment back and its HELLO is on the way: the entry
// must stay.
func (p *parked) withdraw() bool {
	// SYNC POINT with the client's compare-and-swap in takeClient: exactly one of the two wins.
	return atomic.AndUint32(p.word(), ^uint32(serverParked))&serverParked != 0
}

// parkOf takes the segment out of a closed connection.
func parkOf(c *Conn) *parked {
	return &parked{seg: c.seg, lay: c.lay, giveBack: c.incomingPages(), since: time.Now()}
}

// ---- the client's side ----

type clientEntry struct {
	name      string // the listener: rendezvous name and server pid
	serverPid int
	p         *parked
}

var clientParkedSegs struct {
	sync.Mutex
	list []clientEntry // oldest first
}

// parkClient parks the client's side of a connection to the listener name (pid serverPid) that
// closed cleanly. The caller has made its last use of the segment.
func parkClient(name string, serverPid int, p *parked) {
	// SYNC POINT with the compare-and-swap of a later dial of ours in takeClient (our last uses
	// of the segment happen before its reset).
	atomic.OrUint32(p.word(), clientParked)
	var drop []*parked
	s := &clientParkedSegs
	s.Lock()
	s.list = append(s.list, clientEntry{name: name, serverPid: serverPid, p: p})
	for len(s.list) > parkClientMax {
		drop = append(drop, s.list[0].p)
		s.list = s.list[1:]
	}
	s.Unlock()
	releaseAll(drop) // the client lets go without telling anyone
	kickSweeper()
}

// takeClient takes back a segment of geometry g that both sides parked after an earlier
// connection to one of the rendezvous names (tried in order) whose listener is known to have
// welcomed us with the pid it was parked with. The segment is reset; the server's ticket is
// returned with it.
func takeClient(names []string, g Geometry) (*clientEntry, uint32) {
	s := &clientParkedSegs
	s.Lock()
	var e *clientEntry
	for _, name := range names {
		pid, ok := welcomed.Load(name)
		if !ok {
			continue
		}
		i := slices.IndexFunc(s.list, func(e clientEntry) bool {
			return e.name == name && e.serverPid == int(pid.(int32)) && e.p.lay.Geometry == g &&
				// SYNC POINT with both sides' parking read-modify-writes (parkClient,
				// parkTable.park): every use of the segment by either side happens before our
				// reset. Exactly one of this and the server's withdraw (parked.withdraw) wins.
				atomic.CompareAndSwapUint32(e.p.word(), clientParked|serverParked, 0)
		})
		if i >= 0 {
			e = &clientEntry{}
			*e = s.list[i]
			s.list = slices.Delete(s.list, i, i+1)
			break
		}
	}
	s.Unlock()
	if e == nil {
		return nil, 0
	}
	// No ordering of its own: the server's store in parkTable.park is published by its OR
	// of SERVER_PARKED, which our compare-and-swap read.
	ticket := atomic.LoadUint32(u32at(e.p.seg, hTicket))
	resetForReuse(e.p.seg, e.p.lay)
	return e, ticket
}

// resetForReuse makes a segment both sides parked new again: every counter and flags word of both
// direction blocks and both waiting words back to 0, both rings back to their starting size with
// no growth request, and their data pages given back to the system. Only the client calls it, after its
// compare-and-swap of parked from both bits to 0 proved that neither side uses the segment; the
// header from offset 96 on (parked, ticket, waiting lines) is not written otherwise.
func resetForReuse(seg []byte, l layout) {
	for _, base := range []uint64{headerSize, headerSize + l.blockSize} {
		for _, off := range []uint64{dRingHead, dRingTail, dMsgHead, dMsgTail, dFreeHead, dFreeTail} {
			// No partner: nobody else uses the segment now; the HELLO that follows (a system
			// call on the control socket) publishes these stores to the server, which reads the
			// segment only after receiving it.
			atomic.StoreUint64(u64at(seg, base+off), 0)
		}
		for _, off := range []uint64{dRingFlags, dReadFlags} {
			atomic.StoreUint32(u32at(seg, base+off), 0) // as above
		}
	}
	// Waiting words are only ever written by read-modify-writes (section 6); as above, published
	// by the HELLO.
	atomic.SwapUint32(u32at(seg, hClientWaiting), 0)
	atomic.SwapUint32(u32at(seg, hServerWaiting), 0)
	startRings(seg, l) // as above, published by the HELLO
	for _, base := range []uint64{headerSize, headerSize + l.blockSize} {
		// Where MADV_REMOVE fails the pages stay, which is only memory.
		releasePages(seg[base+l.dataOff : base+l.poolOff])
	}
}

// dropParkedClient releases every segment this process parked as a client (tests count
// descriptors).
func dropParkedClient() {
	s := &clientParkedSegs
	s.Lock()
	var drop []*parked
	for _, e := range s.list {
		drop = append(drop, e.p)
	}
	s.list = nil
	s.Unlock()
	releaseAll(drop)
}

// ---- the server's side ----

type serverEntry struct {
	ticket    uint32
	clientPid int32 // the process that dialed it first (SO_PEERCRED)
	p         *parked
}

// parkTable is a listener's parked segments.
type parkTable struct {
	mu     sync.Mutex
	list   []serverEntry // oldest first
	next   uint32        // the next ticket
	closed bool
}

func newParkTable() *parkTable {
	t := &parkTable{next: 1}
	sweeper.Lock()
	sweeper.tables[t] = struct{}{}
	sweeper.Unlock()
	return t
}

// park parks the server's side of a connection from the process clientPid that closed cleanly.
// The caller has made its last use of the segment.
func (t *parkTable) park(clientPid int32, p *parked) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		p.release()
		return
	}
	// A ticket unique among this listener's parked segments.
	for t.next == 0 || slices.ContainsFunc(t.list, func(e serverEntry) bool { return e.ticket == t.next }) {
		t.next++
	}
	ticket := t.next
	t.next++
	// No ordering of its own: the client's load in takeClient sees it, published by the OR
	// below.
	atomic.StoreUint32(u32at(p.seg, hTicket), ticket)
	// SYNC POINT with the client's compare-and-swap in takeClient (the ticket and our last uses
	// of the segment happen before its reset).
	atomic.OrUint32(p.word(), serverParked)
	t.list = append(t.list, serverEntry{ticket: ticket, clientPid: clientPid, p: p})
	var drop *parked
	if len(t.list) > parkServerMax {
		// Let go of the oldest that the client has not taken back.
		if i := slices.IndexFunc(t.list, func(e serverEntry) bool { return e.p.withdraw() }); i >= 0 {
			drop = t.list[i].p
			t.list = slices.Delete(t.list, i, i+1)
		}
	}
	t.mu.Unlock()
	if drop != nil {
		drop.release()
	}
	kickSweeper()
}

var (
	errUnknownTicket = errors.New("no segment parked under that ticket")
	errOtherClient   = errors.New("ticket of another client process")
	errNotTakenBack  = errors.New("the client did not take the segment back")
)

// take returns the segment parked under ticket, which the client clientPid has taken back.
func (t *parkTable) take(ticket uint32, clientPid int32) (*parked, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i := slices.IndexFunc(t.list, func(e serverEntry) bool { return e.ticket == ticket })
	switch {
	case i < 0:
		return nil, errUnknownTicket
	case t.list[i].clientPid != clientPid:
		return nil, errOtherClient
	// SYNC POINT with the client's compare-and-swap to 0 in takeClient (its reset happened
	// before the HELLO that brought us here). The client may have written, closed and parked its
	// side since (clientParked): its bytes and FIN are delivered as for any connection.
	case atomic.LoadUint32(t.list[i].p.word())&serverParked != 0:
		return nil, errNotTakenBack
	}
	p := t.list[i].p
	t.list = slices.Delete(t.list, i, i+1)
	return p, nil
}

// sweep lets go of what was parked longer than parkIdle (an entry its client took back: after
// parkReservedMax); it reports whether anything is still parked.
func (t *parkTable) sweep(now time.Time) bool {
	t.mu.Lock()
	var drop []*parked
	t.list = slices.DeleteFunc(t.list, func(e serverEntry) bool {
		idle := now.Sub(e.p.since)
		if idle >= parkIdle && (e.p.withdraw() || idle >= parkReservedMax) {
			drop = append(drop, e.p)
			return true
		}
		return false
	})
	left := len(t.list) > 0
	t.mu.Unlock()
	releaseAll(drop)
	return left
}

// close lets go of everything parked (the listener is closing); later parks release at once.
func (t *parkTable) close() {
	sweeper.Lock()
	delete(sweeper.tables, t)
	sweeper.Unlock()
	t.mu.Lock()
	t.closed = true
	var drop []*parked
	for _, e := range t.list {
		e.p.withdraw()
		drop = append(drop, e.p)
	}
	t.list = nil
	t.mu.Unlock()
	releaseAll(drop)
}

// ---- releasing what stays parked too long ----

var sweeper = struct {
	sync.Mutex
	running bool   // the sweeper goroutine exists (it ends when nothing is parked)
	kicks   uint64 // parks so far, so that a park during a sweep that found nothing is not missed
	tables  map[*parkTable]struct{}
}{tables: map[*parkTable]struct{}{}}

// kickSweeper makes sure the sweeper runs: something was parked.
func kickSweeper() {
	sweeper.Lock()
	sweeper.kicks++
	if !sweeper.running {
		sweeper.running = true
		go sweepLoop()
	}
	sweeper.Unlock()
}

// sweepLoop releases parked segments as they pass parkIdle, and returns once nothing is parked.
func sweepLoop() {
	for {
		sweeper.Lock()
		kicks := sweeper.kicks
		sweeper.Unlock()
		time.Sleep(parkIdle / 4)
		if sweepAll(time.Now()) {
			continue
		}
		sweeper.Lock()
		if sweeper.kicks == kicks {
			sweeper.running = false
			sweeper.Unlock()
			return
		}
		sweeper.Unlock()
	}
}

// sweepAll sweeps the client's parked segments and every listener's; it reports whether anything
// is still parked.
func sweepAll(now time.Time) bool {
	s := &clientParkedSegs
	s.Lock()
	var drop []*parked
	s.list = slices.DeleteFunc(s.list, func(e clientEntry) bool {
		if now.Sub(e.p.since) >= parkIdle {
			drop = append(drop, e.p)
			return true
		}
		return false
	})
	left := len(s.list) > 0
	s.Unlock()
	releaseAll(drop)
	sweeper.Lock()
	tables := make([]*parkTable, 0, len(sweeper.tables))
	for t := range sweeper.tables {
		tables = append(tables, t)
	}
	sweeper.Unlock()
	for _, t := range tables {
		if t.sweep(now) {
			left = true
		}
	}
	return left
}
