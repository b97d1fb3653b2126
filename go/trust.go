package colo

// Who may use a colo connection (spec/WIRE.md sections 2 and 3; docs/ARCHITECTURE.md, "Trust
// comes from the admitted connection"), as the Rust core's trust.rs decides it. Trust is taken
// from what the kernel says about TCP sockets (/proc/net/tcp{,6}) and about the peer of a Unix
// socket (SO_PEERCRED), never from a name alone.

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// tcpSocket is one socket of /proc/net/tcp or /proc/net/tcp6, its addresses canonical
// (IPv4-mapped IPv6 as IPv4).
type tcpSocket struct {
	local, remote netip.AddrPort
	listening     bool
	uid           uint32
	// unbound: the kernel says the socket is bound to no network device (SO_BINDTODEVICE);
	// false where it is bound, or where the table read does not say (/proc/net/tcp{,6}).
	unbound bool
	// takesV4: an IPv4 socket, or an IPv6 one the kernel says is not IPV6_V6ONLY; false where
	// it is, or where the table read does not say (/proc/net/tcp6).
	takesV4 bool
}

// parseTCPTable reads the sockets of a /proc/net/tcp{,6} text; lines that do not parse are
// skipped.
func parseTCPTable(r io.Reader) []tcpSocket {
	var out []tcpSocket
	sc := bufio.NewScanner(r)
	sc.Scan() // header line
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 {
			continue
		}
		local, okL := procAddr(f[1])
		remote, okR := procAddr(f[2])
		uid, err := strconv.ParseUint(f[7], 10, 32)
		if !okL || !okR || err != nil {
			continue
		}
		out = append(out, tcpSocket{local: local, remote: remote, listening: f[3] == "0A", uid: uint32(uid), takesV4: len(f[1]) == 13})
	}
	return out
}

// procAddr parses an address as /proc/net/tcp{,6} prints it: the address as native-endian
// 32-bit words in hex (one for IPv4, four for IPv6), a colon, the port in hex.
func procAddr(s string) (netip.AddrPort, bool) {
	ipText, portText, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, false
	}
	port, err := strconv.ParseUint(portText, 16, 16)
	if err != nil || (len(ipText) != 8 && len(ipText) != 32) {
		return netip.AddrPort{}, false
	}
	var b [16]byte
	for i := 0; i < len(ipText)/8; i++ {
		w, err := strconv.ParseUint(ipText[i*8:i*8+8], 16, 32)
		if err != nil {
			return netip.AddrPort{}, false
		}
		binary.NativeEndian.PutUint32(b[i*4:], uint32(w))
	}
	var ip netip.Addr
	if len(ipText) == 8 {
		ip = netip.AddrFrom4([4]byte(b[:4]))
	} else {
		ip = netip.AddrFrom16(b).Unmap()
	}
	return netip.AddrPortFrom(ip, uint16(port)), true
}

// tcpSockets reads every TCP socket of this network namespace.
func tcpSockets() []tcpSocket {
	var out []tcpSocket
	for _, path := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		out = append(out, parseTCPTable(f)...)
		f.Close()
	}
	return out
}

// kernelListener finds the listening socket the kernel hands a connection to dialed to: one
// bound to exactly that address (IPv4-mapped counted as IPv4), else the wildcard of the same
// family, else, for IPv4, the IPv6 wildcard (dual-stack unless IPV6_V6ONLY: such a listener
// refuses the connection itself, see tcpSocket.takesV4). A dial to the unspecified address
// reaches loopback. It returns the listener's address, its uid, and whether one uid owns every
// socket listening there (uidOK); ok is false when nothing listens for dialed.
func kernelListener(dialed netip.AddrPort, socks []tcpSocket) (addr netip.AddrPort, uid uint32, uidOK, ok bool) {
	ip := dialed.Addr().Unmap()
	if ip.IsUnspecified() {
		if ip.Is4() {
			ip = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		} else {
			ip = netip.IPv6Loopback()
		}
	}
	cands := []netip.Addr{ip}
	if ip.Is4() {
		cands = append(cands, netip.IPv4Unspecified(), netip.IPv6Unspecified())
	} else {
		cands = append(cands, netip.IPv6Unspecified())
	}
	for _, c := range cands {
		want := netip.AddrPortFrom(c, dialed.Port())
		found := false
		for _, s := range socks {
			if !s.listening || s.local != want {
				continue
			}
			if !found {
				found, uid, uidOK = true, s.uid, true
			} else if s.uid != uid {
				uidOK = false
			}
		}
		if found {
			return want, uid, uidOK, true
		}
	}
	return netip.AddrPort{}, 0, false, false
}

// tcpOwner returns the uid owning the TCP socket (any state) whose local address is local and
// remote address remote; ok is false if there is none, or several that disagree.
func tcpOwner(local, remote netip.AddrPort, socks []tcpSocket) (uid uint32, ok bool) {
	local, remote = canonical(local), canonical(remote)
	found := false
	for _, s := range socks {
		if s.listening || s.local != local || s.remote != remote {
			continue
		}
		if found && s.uid != uid {
			return 0, false
		}
		found, uid = true, s.uid
	}
	return uid, found
}

// otherNameError is a peer check that failed only for the name reached: the TCP listener the
// kernel would give the connection to uses another, own (someone else bound this one).
type otherNameError struct {
	own, msg string
}

func (e *otherNameError) Error() string { return e.msg }

// rendezvousTrusted is the client's peer check (spec section 2): the rendezvous reached (a name
// of the lookup for dialed), whose server has uid serverUID, is trusted if that uid is ours or
// root's, or if it is the rendezvous of the TCP listener the kernel would give a connection to
// dialed and that listener is owned by serverUID. Asks the kernel for its listeners only for a
// server of another uid.
func rendezvousTrusted(dialed netip.AddrPort, reached string, serverUID uint32) error {
	if serverUID == uint32(os.Getuid()) || serverUID == 0 {
		return nil
	}
	return checkRendezvous(dialed, reached, serverUID, tcpListeners())
}

func checkRendezvous(dialed netip.AddrPort, reached string, serverUID uint32, socks []tcpSocket) error {
	addr, uid, uidOK, ok := kernelListener(dialed, socks)
	switch {
	case !ok:
		return fmt.Errorf("colo: rendezvous %s owned by uid %d, but no TCP socket listens for %v", reached, serverUID, dialed)
	case dialed.Addr().Unmap().Is4() && addr.Addr().Is6() && !allTakeV4(addr, socks):
		// An IPv6 wildcard that is IPV6_V6ONLY takes no IPv4 connection (TCP to dialed is
		// refused): a server of another uid could answer WELCOME where TCP says no one listens.
		// Trusted only where the kernel says none there is (sock_diag; /proc/net/tcp6 does not).
		return fmt.Errorf("colo: rendezvous %s owned by uid %d: %v would go to the IPv6 wildcard %v, which is IPV6_V6ONLY or not known not to be (then TCP is refused)", reached, serverUID, dialed, addr)
	case !allUnbound(addr, socks):
		// A listener bound to a device (SO_BINDTODEVICE, open to any user) takes no connection
		// that comes in on another one, loopback's among them: TCP to dialed may be refused
		// while the table lists it. Trusted only where the kernel says no socket there is so
		// bound (sock_diag does; /proc/net/tcp does not).
		return fmt.Errorf("colo: rendezvous %s owned by uid %d: the TCP listener on %v is bound to a network device, or the kernel's table does not say", reached, serverUID, addr)
	case rendezvousName(addr) != reached:
		return &otherNameError{own: rendezvousName(addr), msg: fmt.Sprintf("colo: rendezvous %s owned by uid %d, but %v is served by the TCP listener on %v", reached, serverUID, dialed, addr)}
	case !uidOK:
		return fmt.Errorf("colo: rendezvous owned by uid %d, its TCP listener %v by several uids", serverUID, addr)
	case uid != serverUID:
		return fmt.Errorf("colo: rendezvous owned by uid %d, its TCP listener %v by uid %d", serverUID, addr, uid)
	}
	return nil
}

// allTakeV4 reports whether every listening socket at addr is known to take IPv4 connections.
func allTakeV4(addr netip.AddrPort, socks []tcpSocket) bool {
	for _, s := range socks {
		if s.listening && s.local == addr && !s.takesV4 {
			return false
		}
	}
	return true
}

// allUnbound reports whether every listening socket at addr is known to be bound to no device.
func allUnbound(addr netip.AddrPort, socks []tcpSocket) bool {
	for _, s := range socks {
		if s.listening && s.local == addr && !s.unbound {
			return false
		}
	}
	return true
}

// serves reports whether a listener whose TCP socket is bound to listen (v6only: an IPv6 socket
// with IPV6_V6ONLY) takes TCP connections to dialed, the address a DIRECT client says it dialed
// (invalid: it did not say; then only a listener that is not v6only takes it).
func serves(listen netip.AddrPort, v6only bool, dialed netip.AddrPort) bool {
	if !dialed.IsValid() {
		return !v6only
	}
	l, d := listen.Addr().Unmap(), dialed.Addr().Unmap()
	switch {
	case dialed.Port() != listen.Port():
		return false
	case l.IsUnspecified() && l.Is6():
		return d.Is6() || !v6only
	case l.IsUnspecified():
		return d.Is4()
	}
	return l == d
}

// offerSenderTrusted is claim's check of a CARRIER offer for the TCP connection client ->
// server (spec section 3): its sender, of uid senderUID (SO_PEERCRED of the control socket),
// must own the client end of that connection, unless it is our uid or root.
func offerSenderTrusted(client, server netip.AddrPort, senderUID uint32) error {
	if senderUID == uint32(os.Getuid()) || senderUID == 0 {
		return nil
	}
	uid, ok := connectionOwner(client, server)
	switch {
	case !ok:
		return fmt.Errorf("offer from uid %d for %v -> %v, which it has no socket for", senderUID, client, server)
	case uid != senderUID:
		return fmt.Errorf("offer from uid %d for %v -> %v, a connection of uid %d", senderUID, client, server, uid)
	}
	return nil
}
