package colo

import (
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
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
	claimed chan struct{}
}

// drop releases an offer that will never be claimed (the caller removed it from the map).
func (o *offer) drop() {
	reject(o.c.ctlFd, RejectNotClaimed)
	unmap(o.c)
	for _, fd := range o.fds {
		unix.Close(fd)
	}
	o.c.ctl.Close()
}

// offerCarrier parks a validated CARRIER offer until claimCarrier takes it or it times out.
func (l *Listener) offerCarrier(c *Conn, h header, fds []int, heard func()) {
	o := &offer{c: c, fds: fds, claimed: make(chan struct{})}
	key := offerKey{canonical(h.ClientAddr), canonical(h.ServerAddr)}
	l.offersMu.Lock()
	if old := l.offers[key]; old != nil {
		delete(l.offers, key)
		old.drop()
	}
	l.offers[key] = o
	l.offersMu.Unlock()
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
	mine := l.offers[key] == o
	if mine {
		delete(l.offers, key)
	}
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
	o := l.offers[key]
	if o != nil {
		delete(l.offers, key)
	}
	return o, l.offerEvt
}

// offerEvent wakes the claims waiting for HELLOs (the caller has just read one: counted it off
// pending and, for an offer, stored it): only when one waits, so a DIRECT HELLO costs nothing.
// The pending count is lowered before the channel is closed, and a waiter takes the channel
// before it reads the count, so no wake-up is lost.
func (l *Listener) offerEvent() {
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
	if l.rv == nil {
		return
	}
	for {
		cfd, err := l.acceptControl(l.rvFd)
		if err != nil {
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
	if ra == nil || la == nil || l.rv == nil || ra.Port%2 == 0 || !isLocal(ra.AddrPort().Addr()) {
		return nil
	}
	key := offerKey{canonical(ra.AddrPort()), canonical(la.AddrPort())}
	l.drainRendezvous()
	o, evt := l.takeOfferOrEvent(key)
	if o == nil && l.unreadHellos() > 0 {
		// HELLOs accepted but not read yet: wait for each to be read (offerEvent), not in
		// sleeps, which the runtime rounds up to a millisecond.
		l.claimWaiters.Add(1)
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
		l.claimWaiters.Add(-1)
	}
	if o == nil {
		return nil
	}
	c := o.c
	// Only the owner of the connection's client end may move it onto a segment (spec section 3).
	cred, err := peerCred(c.ctlFd)
	if err == nil {
		err = offerSenderTrusted(key.client, key.server, cred.Uid)
	}
	if err != nil {
		logf("carrier %v not claimed: %v; plain TCP", ra, err)
		o.drop() // REJECT(NOT_CLAIMED)
		close(o.claimed)
		return nil
	}
	// Exactly one of this CAS and the client's OFFERED -> ABANDONED wins.
	if !atomic.CompareAndSwapUint32(u32at(c.seg, hClaim), ClaimOffered, ClaimClaimed) {
		o.drop()
		close(o.claimed)
		return nil
	}
	putLE32(c.seg, hServerPid, uint32(unixGetpid()))
	c.laddr, c.raddr = la, ra
	close(o.claimed)
	if !l.finish(c, o.fds) {
		return nil
	}
	c.carrier = tc
	return c
}
