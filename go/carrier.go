package colo

import (
	"net"
	"net/netip"
	"sync/atomic"
	"time"
)

// CARRIER mode, server side (spec/WIRE.md section 3). A client (typically the LD_PRELOAD shim)
// offers a segment keyed by its TCP 4-tuple before connecting; the offer waits here until the
// listener accepts that TCP connection and claims it. The TCP connection then carries no payload
// and stays open until the colo connection closes.

// offerTimeout bounds how long an unclaimed offer is kept.
const offerTimeout = 10 * time.Second

// claimWait bounds how long a TCP accept from a local address waits for HELLOs that were
// accepted on the rendezvous but not yet read (the HELLO of a CARRIER client is sent before its
// TCP SYN, so it is always there already).
const claimWait = 100 * time.Millisecond

type offerKey struct{ client, server netip.AddrPort }

func canonical(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

type offer struct {
	c       *Conn
	fds     []int
	uid     uint32 // the sender's (SO_PEERCRED of the control socket)
	claimed chan struct{}
}

// maxOffersPerKey bounds the offers kept for one 4-tuple. Only one sender can own the
// connection's client end, and which one is known only at the claim: an offer that replaced
// the earlier one (anyone can read a connection's 4-tuple in /proc/net/tcp, and offer for it
// after the real client) would let another user keep that client off shared memory. So a later
// offer replaces only one from its own uid; one from another uid is kept beside it, and
// claimCarrier tries them oldest first (its owner check refuses the others).
const maxOffersPerKey = 8

// removeOffer takes o out of its key's list (the caller holds offersMu); false if it was not
// there.
func (l *Listener) removeOffer(key offerKey, o *offer) bool {
	list := l.offers[key]
	for i, x := range list {
		if x == o {
			list = append(list[:i:i], list[i+1:]...)
			if len(list) == 0 {
				delete(l.offers, key)
			} else {
				l.offers[key] = list
			}
			return true
		}
	}
	return false
}

// offerOfUID is the index in list of the offer from uid, or -1.
func offerOfUID(list []*offer, uid uint32) int {
	for i, o := range list {
		if o.uid == uid {
			return i
		}
	}
	return -1
}

// drop releases an offer that will never be claimed (the caller removed it from the map).
func (o *offer) drop() {
	reject(o.c.ctlFd, RejectNotClaimed)
	unmap(o.c)
	for _, fd := range o.fds {
		discardFd(fd) // unused: the memfd (gift.go)
	}
	o.c.ctl.Close()
}

// offerCarrier parks a validated CARRIER offer until claimCarrier takes it or it times out.
func (l *Listener) offerCarrier(c *Conn, h header, fds []int, heard func()) {
	o := &offer{c: c, fds: fds, uid: ^uint32(0), claimed: make(chan struct{})}
	if cred, err := peerCred(c.ctlFd); err == nil {
		o.uid = cred.Uid
	}
	key := offerKey{canonical(h.ClientAddr), canonical(h.ServerAddr)}
	l.offersMu.Lock()
	list := l.offers[key]
	kept := true
	switch i := offerOfUID(list, o.uid); {
	case i >= 0:
		list[i].drop() // its goroutine finds it gone from the list when its time is up
		list[i] = o
	case len(list) >= maxOffersPerKey:
		kept = false
	default:
		l.offers[key] = append(list, o)
	}
	l.offersMu.Unlock()
	if !kept {
		o.drop()
		heard()
		return
	}
	heard()
	t := time.NewTimer(offerTimeout)
	defer t.Stop()
	select {
	case <-o.claimed:
		return
	case <-t.C:
	case <-l.done:
	}
	l.offersMu.Lock()
	mine := l.removeOffer(key, o)
	l.offersMu.Unlock()
	if mine {
		o.drop()
	}
}

// takeOfferOrEvent removes and returns the offer for key, or nil and the channel that
// offerEvent will close when the next HELLO has been read.
func (l *Listener) takeOfferOrEvent(key offerKey) (*offer, chan struct{}) {
	l.offersMu.Lock()
	defer l.offersMu.Unlock()
	var o *offer
	if list := l.offers[key]; len(list) > 0 {
		o = list[0]
		l.removeOffer(key, o)
	}
	return o, l.offerEvt
}

// offerEvent wakes the claims waiting for HELLOs (the caller has just read one: counted it off
// pending and, for an offer, stored it): only when one waits, so a DIRECT HELLO costs nothing.
// The pending count is lowered before the channel is closed, and a waiter takes the channel
// before it reads the count, so no wake-up is lost.
func (l *Listener) offerEvent() {
	// SYNC POINT with the Add in claimCarrier (made before its first look at the offers).
	if l.claimWaiters.Load() == 0 {
		return
	}
	l.offersMu.Lock()
	close(l.offerEvt)
	l.offerEvt = make(chan struct{})
	l.offersMu.Unlock()
}

// drainRendezvous accepts every connection waiting in the rendezvous backlog, without blocking.
func (l *Listener) drainRendezvous() {
	rv := l.rv.Load()
	if rv == nil {
		return
	}
	rc, err := rv.SyscallConn()
	if err != nil {
		return
	}
	for {
		// Inside Control, a Close meanwhile waits for the accept: the number is still the
		// rendezvous's (a closed one may already be another socket's).
		cfd, aerr := -1, error(net.ErrClosed)
		if rc.Control(func(fd uintptr) { cfd, aerr = l.acceptControl(int(fd)) }) != nil || aerr != nil {
			return
		}
		if uid, ok := l.admitHalfOpen(cfd); ok {
			l.spawnHello(cfd, nil, uid)
		}
	}
}

// claimCarrier returns the colo connection a CARRIER client offered for this TCP connection, or
// nil: the connection stays plain TCP.
func (l *Listener) claimCarrier(tc *net.TCPConn) *Conn {
	ra, la := tc.RemoteAddr().(*net.TCPAddr), tc.LocalAddr().(*net.TCPAddr)
	// Only odd ports are offered (spec section 3): a connection from an even port is plain TCP,
	// and is never held up waiting for HELLOs (silent rendezvous clients would otherwise delay
	// every local TCP accept by up to claimWait).
	if ra == nil || la == nil || l.rv.Load() == nil || ra.Port%2 == 0 || !isLocal(ra.AddrPort().Addr()) {
		return nil
	}
	key := offerKey{canonical(ra.AddrPort()), canonical(la.AddrPort())}
	l.drainRendezvous()
	// Counted as a waiter before the first look, so that a HELLO stored after it closes the
	// channel taken with it (offerEvent skips the close only when nobody waits).
	l.claimWaiters.Add(1) // SYNC POINT with the Load in offerEvent
	o, evt := l.takeOfferOrEvent(key)
	if o == nil && l.unreadHellos() > 0 {
		// HELLOs accepted but not read yet: wait for each to be read (offerEvent), not in
		// sleeps, which the runtime rounds up to a millisecond.
		deadline := time.Now().Add(claimWait)
		t := time.NewTimer(claimWait)
		for o == nil && l.unreadHellos() > 0 {
			select {
			case <-evt:
			case <-t.C:
			}
			if o, evt = l.takeOfferOrEvent(key); o == nil && !time.Now().Before(deadline) {
				break
			}
		}
		t.Stop()
	}
	if o == nil {
		// A HELLO is stored before it is counted off pending (offerCarrier, then heard): once
		// none reads as unread, an offer read meanwhile is in the map.
		o, _ = l.takeOfferOrEvent(key)
	}
	l.claimWaiters.Add(-1) // a count: orders nothing on the way out
	// Offers of several users may name this 4-tuple (maxOffersPerKey): each is tried in turn,
	// oldest first, until one is claimed.
	for ; o != nil; o, _ = l.takeOfferOrEvent(key) {
		c := o.c
		// Only the owner of the connection's client end may move it onto a segment (spec
		// section 3).
		cred, err := peerCred(c.ctlFd)
		if err == nil {
			err = offerSenderTrusted(key.client, key.server, cred.Uid)
		}
		if err != nil {
			logf("carrier %v not claimed: %v; plain TCP", ra, err)
			o.drop() // REJECT(NOT_CLAIMED)
			close(o.claimed)
			continue
		}
		// Exactly one of this CAS and the client's OFFERED -> ABANDONED wins. SYNC POINT with
		// the client's CompareAndSwap of claim in carrierClient (dial.go).
		if !atomic.CompareAndSwapUint32(u32at(c.seg, hClaim), ClaimOffered, ClaimClaimed) {
			o.drop()
			close(o.claimed)
			continue
		}
		// The others for this connection can never be claimed now.
		for other, _ := l.takeOfferOrEvent(key); other != nil; other, _ = l.takeOfferOrEvent(key) {
			other.drop()
			close(other.claimed)
		}
		return l.claimed(tc, o, la, ra)
	}
	return nil
}

// claimed finishes the connection of offer o, claimed for the TCP connection tc.
func (l *Listener) claimed(tc *net.TCPConn, o *offer, la, ra *net.TCPAddr) *Conn {
	c := o.c
	putLE32(c.seg, hServerPid, uint32(unixGetpid()))
	c.laddr, c.raddr = la, ra
	close(o.claimed)
	if !l.finish(c, o.fds) {
		return nil
	}
	c.carrier = tc
	return c
}
