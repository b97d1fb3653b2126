package colo

// TCP sockets as the kernel's sock_diag netlink interface reports them (what ss uses): the
// listening sockets alone, or the one socket with a given pair of addresses, each found without
// walking every connection of the host (/proc/net/tcp lists every TIME_WAIT socket too: tens of
// milliseconds to read on a host that makes short-lived connections). As rust/colo-sys/src/diag.rs.

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"golang.org/x/sys/unix"
)

const (
	sockDiagByFamily = 20
	diagSockID       = 48                  // struct inet_diag_sockid
	diagReq          = 8 + diagSockID      // struct inet_diag_req_v2
	diagMsgUIDEnd    = 4 + diagSockID + 16 // struct inet_diag_msg up to idiag_uid
	diagMsg          = diagMsgUIDEnd + 4   // struct inet_diag_msg, its attributes after it
	diagSkV6Only     = 11                  // INET_DIAG_SKV6ONLY: IPV6_V6ONLY, one byte
	tcpListenState   = 10
)

// diagQuery sends one inet_diag_req_v2 for TCP sockets of family in states (a bit mask) with
// the socket id, and calls each with every inet_diag_msg of the answer (dump: all matching
// sockets; else the one with exactly that id, if any).
func diagQuery(family uint8, states uint32, id [diagSockID]byte, dump bool, each func(m []byte)) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// The kernel answers at once; the bound only keeps a broken answer from hanging a dial.
	tv := unix.Timeval{Sec: 1}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return err
	}
	var msg [unix.NLMSG_HDRLEN + diagReq]byte
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], sockDiagByFamily)
	flags := uint16(unix.NLM_F_REQUEST)
	if dump {
		flags |= unix.NLM_F_DUMP
	}
	ne.PutUint16(msg[6:], flags)
	req := msg[unix.NLMSG_HDRLEN:]
	req[0], req[1] = family, unix.IPPROTO_TCP
	ne.PutUint32(req[4:], states)
	copy(req[8:], id[:])
	if err := unix.Sendto(fd, msg[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 32<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		for at := 0; at+unix.NLMSG_HDRLEN <= n; {
			l, kind := int(ne.Uint32(buf[at:])), ne.Uint16(buf[at+4:])
			if l < unix.NLMSG_HDRLEN || at+l > n {
				return errors.New("colo: truncated netlink message")
			}
			body := buf[at+unix.NLMSG_HDRLEN : at+l]
			switch {
			case kind == unix.NLMSG_DONE:
				return nil
			case kind == unix.NLMSG_ERROR:
				if len(body) >= 4 {
					if e := -int32(ne.Uint32(body)); e != 0 && e != int32(unix.ENOENT) {
						return unix.Errno(e)
					}
				}
				return nil
			case kind == sockDiagByFamily && len(body) >= diagMsgUIDEnd:
				each(body)
				if !dump {
					return nil
				}
			}
			at += (l + 3) &^ 3
		}
	}
}

// diagSocket is the socket an inet_diag_msg describes (addresses canonical).
func diagSocket(m []byte) tcpSocket {
	id := m[4 : 4+diagSockID]
	addr := func(ip, port []byte) netip.AddrPort {
		var a netip.Addr
		if m[0] == unix.AF_INET {
			a = netip.AddrFrom4([4]byte(ip[:4]))
		} else {
			a = netip.AddrFrom16([16]byte(ip[:16])).Unmap()
		}
		return netip.AddrPortFrom(a, binary.BigEndian.Uint16(port))
	}
	// dualStack: IPv4, or IPv6 whose IPV6_V6ONLY attribute the kernel says is 0.
	dualStack := m[0] == unix.AF_INET
	if v := diagAttribute(m, diagSkV6Only); m[0] == unix.AF_INET6 && len(v) > 0 {
		dualStack = v[0] == 0
	}
	return tcpSocket{local: addr(id[4:20], id[0:2]), remote: addr(id[20:36], id[2:4]),
		listening: m[1] == tcpListenState, uid: binary.NativeEndian.Uint32(m[diagMsgUIDEnd-4:]),
		unbound: binary.NativeEndian.Uint32(id[36:40]) == 0, // idiag_if: the bound device, 0 for none
		takesV4: dualStack}
}

// diagAttribute returns the payload of the attribute of type kind after an inet_diag_msg, or
// nil if the kernel did not send it.
func diagAttribute(m []byte, kind uint16) []byte {
	for at := diagMsg; at+4 <= len(m); {
		l := int(binary.NativeEndian.Uint16(m[at:]))
		if l < 4 || at+l > len(m) {
			return nil
		}
		if binary.NativeEndian.Uint16(m[at+2:])&0x3fff == kind {
			return m[at+4 : at+l]
		}
		at += (l + 3) &^ 3
	}
	return nil
}

func noCookie() (id [diagSockID]byte) {
	for i := 40; i < diagSockID; i++ {
		id[i] = 0xff // INET_DIAG_NOCOOKIE: any socket, whatever its cookie
	}
	return id
}

// diagListeners returns every listening TCP socket of this network namespace.
func diagListeners() ([]tcpSocket, error) {
	var out []tcpSocket
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		if err := diagQuery(family, 1<<tcpListenState, noCookie(), true, func(m []byte) { out = append(out, diagSocket(m)) }); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// diagConnection finds the TCP socket (not a listener) whose local address is local and remote
// address remote, by the kernel's own lookup; ok is false if there is none.
func diagConnection(local, remote netip.AddrPort) (s tcpSocket, ok bool, err error) {
	local, remote = canonical(local), canonical(remote)
	if local.Addr().Is4() != remote.Addr().Is4() {
		return tcpSocket{}, false, nil
	}
	id := noCookie()
	binary.BigEndian.PutUint16(id[0:], local.Port())
	binary.BigEndian.PutUint16(id[2:], remote.Port())
	family := uint8(unix.AF_INET6)
	if local.Addr().Is4() {
		family = unix.AF_INET
		a, b := local.Addr().As4(), remote.Addr().As4()
		copy(id[4:], a[:])
		copy(id[20:], b[:])
	} else {
		a, b := local.Addr().As16(), remote.Addr().As16()
		copy(id[4:], a[:])
		copy(id[20:], b[:])
	}
	err = diagQuery(family, ^uint32(0), id, false, func(m []byte) { s, ok = diagSocket(m), true })
	// The lookup falls back to a listener on the local address: only the exact pair counts.
	ok = ok && !s.listening && s.local == local && s.remote == remote
	return s, ok, err
}

// tcpListeners returns the listening TCP sockets: from sock_diag, or, where that is refused,
// from /proc/net/tcp{,6}.
func tcpListeners() []tcpSocket {
	if l, err := diagListeners(); err == nil {
		return l
	}
	var out []tcpSocket
	for _, s := range tcpSockets() {
		if s.listening {
			out = append(out, s)
		}
	}
	return out
}

// connectionOwner returns the uid owning the TCP socket (not a listener) local -> remote: from
// the sock_diag lookup, or, where that is refused, from /proc/net/tcp{,6}.
func connectionOwner(local, remote netip.AddrPort) (uint32, bool) {
	s, ok, err := diagConnection(local, remote)
	if err != nil {
		return tcpOwner(local, remote, tcpSockets())
	}
	return s.uid, ok
}
