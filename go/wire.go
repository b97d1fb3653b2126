package colo

// This file holds the byte-level definitions of spec/WIRE.md (version 1): handshake messages,
// the segment header, the direction-block layout and the rendezvous names. Nothing here touches
// the operating system; it is what the golden vectors in spec/vectors test.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Protocol constants (spec/WIRE.md sections 3 and 4).
const (
	Version = 1

	msgMagic   = 0x4F4C4F43 // "COLO" little-endian
	msgSize    = 16
	headerSize = 1024
	lineSize   = 128

	MsgHello   = 1
	MsgWelcome = 2
	MsgReject  = 3

	ModeDirect  = 1
	ModeCarrier = 2

	RejectBadMessage  = 1
	RejectBadVersion  = 2
	RejectBadSegment  = 3
	RejectNeedCarrier = 4
	RejectNotClaimed  = 5
	RejectNoResources = 6
	RejectNotServed   = 7 // the listener's TCP socket does not take the dialed address (IPV6_V6ONLY)

	ClaimDirect    = 0
	ClaimOffered   = 1
	ClaimClaimed   = 2
	ClaimAbandoned = 3

	// HELLO flags bit: reuse a parked segment; no descriptors, the ticket in bytes 12..16
	// (section 3, "Recycling").
	flagRecycle = 1
	// Bits of the header's parked word.
	clientParked = 1
	serverParked = 2

	flagFIN   = 1
	flagRESET = 2
	// The producer of this ring no longer reads the opposite one (CloseRead or Close): the
	// opposite producer's writes fail with EPIPE. In ring_flags, which every write reads anyway,
	// so that a write never pulls the consumer's ring_tail line (spec section 8).
	flagNotReading = 4
	// Set with RESET: the producer gave back the pages of its unread bytes (a side that closed
	// with bytes its peer of another user left unread too long, spec section 8, "Orphaned
	// bytes"). A consumer that sees it after a copy drops what it copied (zeros, maybe).
	flagDropped     = 8
	ringFlags       = flagFIN | flagRESET | flagNotReading | flagDropped
	flagReadClosed  = 1
	maxPublishChunk = 16 << 10

	minRingCapacity = 4096
	maxRingCapacity = 1 << 30
	// The size every byte ring starts at and shrinks back to (spec section 5, "Growing and
	// shrinking"); ring_capacity is the largest it may grow to.
	minRingSize  = 2048
	maxSlotSize  = 1 << 30
	maxSlotCount = 65536
)

var segMagic = [8]byte{'C', 'O', 'L', 'O', 'S', 'E', 'G', 0}

// Header field offsets.
const (
	hMagic         = 0
	hVersion       = 8
	hHeaderSize    = 12
	hSegmentSize   = 16
	hRingCapacity  = 24
	hSlotSize      = 28
	hSlotCount     = 32
	hClaim         = 36
	hClientPid     = 40
	hServerPid     = 44
	hClientAddr    = 48
	hServerAddr    = 72
	hParked        = 96 // atomic: clientParked | serverParked (section 3, "Recycling")
	hTicket        = 100
	hClientWaiting = 128
	hServerWaiting = 256
)

// Direction block field offsets.
const (
	dRingHead  = 0
	dRingFlags = 8
	dRingSize  = 12 // the ring's current size, written by the producer (spec section 5)
	dSpaceWake = 16 // a producer waiting for space is woken at this many unread bytes (spec section 6)
	dRingTail  = 128
	dReadFlags = 136
	dMsgHead   = 256
	dMsgTail   = 384
	dFreeHead  = 512
	dFreeTail  = 640
	dMsgEnt    = 768
)

// Message is a decoded 16-byte handshake message.
type hsMsg struct {
	Type, Version, Arg uint8
	Flags              uint32
	Ticket             uint32 // HELLO with flagRecycle: the server's ticket
}

func (m hsMsg) encode() []byte {
	b := make([]byte, msgSize)
	binary.LittleEndian.PutUint32(b[0:], msgMagic)
	b[4], b[5], b[6] = m.Type, m.Version, m.Arg
	binary.LittleEndian.PutUint32(b[8:], m.Flags)
	binary.LittleEndian.PutUint32(b[12:], m.Ticket)
	return b
}

// recycle reports whether m is a DIRECT HELLO that reuses a parked segment (the RECYCLE flag
// means nothing on other messages).
func (m hsMsg) recycle() bool {
	return m.Type == MsgHello && m.Arg == ModeDirect && m.Flags&flagRecycle != 0
}

var errBadMessage = errors.New("colo: malformed handshake message")

// decodeMsg parses a handshake message. It checks what a receiver of any message checks: size,
// magic, known type, and for HELLO a known mode. Version is left to the caller.
func decodeMsg(b []byte) (hsMsg, error) {
	if len(b) != msgSize || binary.LittleEndian.Uint32(b) != msgMagic {
		return hsMsg{}, errBadMessage
	}
	le := binary.LittleEndian
	m := hsMsg{Type: b[4], Version: b[5], Arg: b[6], Flags: le.Uint32(b[8:]), Ticket: le.Uint32(b[12:])}
	switch m.Type {
	case MsgHello:
		if m.Arg != ModeDirect && m.Arg != ModeCarrier {
			return hsMsg{}, errBadMessage
		}
	case MsgWelcome, MsgReject:
	default:
		return hsMsg{}, errBadMessage
	}
	return m, nil
}

// Geometry is the shape of a segment: the byte ring's capacity and the optional pool.
type Geometry struct {
	RingCapacity uint32 // the largest a byte ring may grow to: a power of two, 4096 ..= 2^30
	SlotSize     uint32 // bytes of each pool slot: a multiple of 64 (0: no pool)
	SlotCount    uint32 // number of pool slots, 0 ..= 65536 (0 iff SlotSize is 0)
}

// layout is a Geometry with the derived offsets of section 4.
type layout struct {
	Geometry
	dataOff, poolOff, blockSize, segmentSize uint64
}

func roundUp(x, a uint64) uint64 { return (x + a - 1) / a * a }

func (g Geometry) valid() error {
	c := g.RingCapacity
	switch {
	case c < minRingCapacity || c > maxRingCapacity || c&(c-1) != 0:
		return fmt.Errorf("colo: ring capacity %d is not a power of two in 4096..2^30", c)
	case g.SlotSize%64 != 0 || g.SlotSize > maxSlotSize:
		return fmt.Errorf("colo: slot size %d is not a multiple of 64 up to 2^30", g.SlotSize)
	case g.SlotCount > maxSlotCount:
		return fmt.Errorf("colo: slot count %d exceeds 65536", g.SlotCount)
	case (g.SlotCount == 0) != (g.SlotSize == 0):
		return fmt.Errorf("colo: slot count %d and slot size %d: both or neither must be 0", g.SlotCount, g.SlotSize)
	}
	return nil
}

func (g Geometry) layout() layout {
	n := uint64(g.SlotCount)
	l := layout{Geometry: g}
	l.dataOff = roundUp(dMsgEnt+12*n, 1024)
	l.poolOff = roundUp(l.dataOff+uint64(g.RingCapacity), 4096)
	l.blockSize = roundUp(l.poolOff+n*uint64(g.SlotSize), 4096)
	l.segmentSize = headerSize + 2*l.blockSize
	return l
}

func (l layout) freeOff() uint64 { return dMsgEnt + 8*uint64(l.SlotCount) }

// header is the decoded fixed part of a segment header.
type header struct {
	Geometry
	SegmentSize          uint64
	Claim                uint32
	ClientPid, ServerPid uint32
	ClientAddr           netip.AddrPort
	ServerAddr           netip.AddrPort
}

func putAddr(b []byte, a netip.AddrPort) {
	for i := range b[:24] {
		b[i] = 0
	}
	if !a.IsValid() {
		return
	}
	ip := a.Addr()
	if ip.Is4() || ip.Is4In6() {
		binary.LittleEndian.PutUint16(b[0:], 4)
		v := ip.Unmap().As4()
		copy(b[4:], v[:])
	} else {
		binary.LittleEndian.PutUint16(b[0:], 6)
		v := ip.As16()
		copy(b[4:], v[:])
	}
	binary.LittleEndian.PutUint16(b[2:], a.Port())
}

func getAddr(b []byte) (netip.AddrPort, error) {
	fam := binary.LittleEndian.Uint16(b[0:])
	port := binary.LittleEndian.Uint16(b[2:])
	switch fam {
	case 0:
		return netip.AddrPort{}, nil
	case 4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port), nil
	case 6:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[4:20])), port), nil
	}
	return netip.AddrPort{}, fmt.Errorf("colo: bad address family %d", fam)
}

// encode writes the header's fixed fields, bytes 0..96, into b (at least 96 bytes; the rest is
// left as is).
func (h *header) encode(b []byte) {
	copy(b[hMagic:], segMagic[:])
	le := binary.LittleEndian
	le.PutUint32(b[hVersion:], Version)
	le.PutUint32(b[hHeaderSize:], headerSize)
	le.PutUint64(b[hSegmentSize:], h.SegmentSize)
	le.PutUint32(b[hRingCapacity:], h.RingCapacity)
	le.PutUint32(b[hSlotSize:], h.SlotSize)
	le.PutUint32(b[hSlotCount:], h.SlotCount)
	le.PutUint32(b[hClaim:], h.Claim)
	le.PutUint32(b[hClientPid:], h.ClientPid)
	le.PutUint32(b[hServerPid:], h.ServerPid)
	putAddr(b[hClientAddr:], h.ClientAddr)
	putAddr(b[hServerAddr:], h.ServerAddr)
}

var errBadSegment = errors.New("colo: invalid segment header")

// decodeHeader parses and validates a header (section 4): magic, version, header size,
// geometry, claim, and segment_size equal to the size computed from the geometry.
func decodeHeader(b []byte) (header, layout, error) {
	if len(b) < lineSize {
		return header{}, layout{}, errBadSegment
	}
	le := binary.LittleEndian
	var h header
	if [8]byte(b[0:8]) != segMagic {
		return h, layout{}, fmt.Errorf("%w: bad magic", errBadSegment)
	}
	if v := le.Uint32(b[hVersion:]); v != Version {
		return h, layout{}, fmt.Errorf("%w: version %d", errBadSegment, v)
	}
	if s := le.Uint32(b[hHeaderSize:]); s != headerSize {
		return h, layout{}, fmt.Errorf("%w: header size %d", errBadSegment, s)
	}
	h.SegmentSize = le.Uint64(b[hSegmentSize:])
	h.RingCapacity = le.Uint32(b[hRingCapacity:])
	h.SlotSize = le.Uint32(b[hSlotSize:])
	h.SlotCount = le.Uint32(b[hSlotCount:])
	h.Claim = le.Uint32(b[hClaim:])
	h.ClientPid = le.Uint32(b[hClientPid:])
	h.ServerPid = le.Uint32(b[hServerPid:])
	if err := h.Geometry.valid(); err != nil {
		return h, layout{}, fmt.Errorf("%w: %v", errBadSegment, err)
	}
	if h.Claim > ClaimAbandoned {
		return h, layout{}, fmt.Errorf("%w: claim %d", errBadSegment, h.Claim)
	}
	l := h.Geometry.layout()
	if l.segmentSize != h.SegmentSize {
		return h, layout{}, fmt.Errorf("%w: segment size %d, geometry says %d", errBadSegment, h.SegmentSize, l.segmentSize)
	}
	var err error
	if h.ClientAddr, err = getAddr(b[hClientAddr:]); err != nil {
		return h, layout{}, fmt.Errorf("%w: %v", errBadSegment, err)
	}
	if h.ServerAddr, err = getAddr(b[hServerAddr:]); err != nil {
		return h, layout{}, fmt.Errorf("%w: %v", errBadSegment, err)
	}
	return h, l, nil
}

// rendezvousName is the abstract socket name (without the leading NUL) for a TCP address.
func rendezvousName(a netip.AddrPort) string {
	a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	return "colo/1/" + a.String()
}

// lookupNames is the ordered list of names a client tries for a local address (section 2).
// It returns nil for an unspecified address, which is never looked up.
func lookupNames(a netip.AddrPort) []string {
	ip := a.Addr().Unmap()
	if ip.IsUnspecified() || !ip.IsValid() {
		return nil
	}
	p := a.Port()
	names := []string{rendezvousName(netip.AddrPortFrom(ip, p))}
	if ip.Is4() {
		names = append(names,
			rendezvousName(netip.AddrPortFrom(netip.IPv4Unspecified(), p)),
			rendezvousName(netip.AddrPortFrom(netip.IPv6Unspecified(), p)))
	} else {
		names = append(names, rendezvousName(netip.AddrPortFrom(netip.IPv6Unspecified(), p)))
	}
	return names
}

// ringState computes readable and writable bytes from head and tail; ok is false if the pair is
// corrupt (more than capacity apart, wrapping).
func ringState(capacity, head, tail uint64) (readable, writable uint64, ok bool) {
	used := head - tail
	if used > capacity {
		return 0, 0, false
	}
	return used, capacity - used, true
}

// badRingFlags reports a ring_flags word that breaks section 8: a bit not named there, or
// DROPPED without RESET (a reader would wait on a ring whose bytes are gone).
func badRingFlags(fl uint32) bool {
	return fl&^ringFlags != 0 || fl&(flagDropped|flagRESET) == flagDropped
}
