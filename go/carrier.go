package colo

import (
	"net"
	"net/netip"
)

// CARRIER mode, server side (spec/WIRE.md section 3). An offer waits, keyed by its TCP 4-tuple,
// until the listener accepts that TCP connection and claims it.

type offerKey struct{ client, server netip.AddrPort }

type offer struct {
	c   *Conn
	fds []int
}

func (o *offer) drop() {}

// offerCarrier handles a CARRIER HELLO. Not yet supported: the client is told NOT_CLAIMED and
// keeps its plain TCP connection.
func (l *Listener) offerCarrier(c *Conn, h header, fds []int) (*Conn, uint8) {
	_ = h
	_ = fds
	unmap(c)
	return nil, RejectNotClaimed
}

// claimCarrier returns the colo connection offered for this TCP connection, or nil.
func (l *Listener) claimCarrier(tc *net.TCPConn) *Conn {
	return nil
}
