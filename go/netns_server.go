package colo

// The server side of colo across network namespaces (spec section 11): with COLO_NETNS_DIR set,
// a listener also binds a rendezvous in that directory; a TCP connection from another
// namespace that opens with a PROPOSAL is answered ACCEPT (a fresh server nonce) before Accept
// returns it, and the CARRIER offer proving both nonces, arriving at that rendezvous, is claimed
// for it. Anything else leaves the connection plain TCP, its stream as the client wrote it.

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

const (
	netnsDecline     = 3
	netnsMaxPending  = 256
	netnsProposalTyp = 1
)

// netnsWait is how long a listener waits for the first bytes of a connection from another
// namespace (COLO_NETNS_WAIT_MS, 50 ms).
var netnsWait = sync.OnceValue(func() time.Duration {
	var ms int
	if _, err := fmt.Sscan(os.Getenv("COLO_NETNS_WAIT_MS"), &ms); err == nil && ms >= 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return 50 * time.Millisecond
})

// netnsConfigured: this process serves other namespaces (COLO_NETNS_DIR is set), so a connection
// from one is looked at for a PROPOSAL even when this listener could not bind its rendezvous
// (then declined: its application must never see one).
var netnsConfigured = sync.OnceValue(func() bool { return os.Getenv("COLO_NETNS_DIR") != "" })

// netnsClients is COLO_NETNS_CLIENTS: the networks or addresses whose proposals this server takes
// (none when unset: a server with COLO_NETNS_DIR alone answers nobody). A relay that is not colo
// (a TCP load balancer, a proxy) must not be listed, or a tenant behind it could reach this
// server around it.
var netnsClients = sync.OnceValue(func() []netnsRule { return parseNetnsRules(os.Getenv("COLO_NETNS_CLIENTS"), "/") })

// netnsClientAllowed: a connection from a may carry a PROPOSAL this server takes.
func netnsClientAllowed(a netip.Addr) bool {
	for _, r := range netnsClients() {
		if r.net.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

type netnsServer struct {
	rv    *os.File
	path  string
	name  string
	live  int // holds the write lock (lockLive) on path+".live" while served
	owner int
	boot  []byte
	mu    sync.Mutex
	// Live nonce pairs (client nonce, server nonce) of connections answered ACCEPT, each with
	// the channel its claimer waits on (buffered: one offer).
	pending map[[24]byte]chan *offer
}

// bindNetns binds the listener's rendezvous in COLO_NETNS_DIR (nil: not configured, or not
// usable: logged, and the listener serves its own namespace only).
func bindNetns(port uint16) *netnsServer {
	dir := os.Getenv("COLO_NETNS_DIR")
	if dir == "" {
		return nil
	}
	s := &netnsServer{name: fmt.Sprintf("%s%d-%d", netnsPrefix, os.Getpid(), port), owner: os.Getpid(), pending: map[[24]byte]chan *offer{}, live: -1}
	s.path = filepath.Join(dir, s.name)
	err := func() error {
		var err error
		if s.boot, err = bootID(); err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		sweepStale(dir)
		sa := &unix.SockaddrUnix{Name: s.path}
		if err = unix.Bind(fd, sa); err == unix.EADDRINUSE {
			// Ours from an earlier image of this pid, or a dead server's: replaced unless served.
			probe, perr := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
			if perr == nil {
				perr = unix.Connect(probe, sa)
				unix.Close(probe)
			}
			if perr == nil {
				unix.Close(fd)
				return unix.EADDRINUSE
			}
			os.Remove(s.path)
			err = unix.Bind(fd, sa)
		}
		if err == nil {
			err = openToAll(s.path) // the directory's mounts decide who reaches it
		}
		if err == nil {
			err = unix.Listen(fd, 1024)
		}
		if err != nil {
			unix.Close(fd)
			return err
		}
		s.rv = os.NewFile(uintptr(fd), "colo-netns-rendezvous")
		// Last: clients propose once this lock is seen.
		if s.live, err = holdLive(s.path + netnsLiveSuffix); err != nil {
			s.rv.Close()
			return err
		}
		return nil
	}()
	if err != nil {
		logf("COLO_NETNS_DIR %s: %s: %v; serving this namespace only", dir, s.name, err)
		return nil
	}
	return s
}

func (s *netnsServer) close() {
	s.rv.Close()
	if os.Getpid() == s.owner {
		os.Remove(s.path)
		os.Remove(s.path + netnsLiveSuffix)
	}
	unix.Close(s.live)
	s.mu.Lock()
	for k, ch := range s.pending {
		drainNetns(ch)
		delete(s.pending, k)
	}
	s.mu.Unlock()
}

// drainNetns drops an offer left in ch (the caller holds s.mu).
func drainNetns(ch chan *offer) {
	select {
	case o := <-ch:
		o.drop()
		close(o.claimed)
	default:
	}
}

// route hands the CARRIER offer c (validated and mapped by adopt) to the connection whose live
// nonces its header's proof carries. Every offer with a proof is taken here: false only for
// one without (all zero), which is an ordinary offer of this namespace.
func (s *netnsServer) route(c *Conn, fds []int) bool {
	var k [24]byte
	copy(k[:], c.seg[hProof:hProof+24])
	if k == ([24]byte{}) {
		return false
	}
	o := &offer{c: c, fds: fds, uid: ^uint32(0), claimed: make(chan struct{})}
	s.mu.Lock()
	ch := s.pending[k]
	delete(s.pending, k) // single-use
	if ch != nil {
		ch <- o // buffered, and only ever sent to once: never blocks
	}
	s.mu.Unlock()
	if ch == nil {
		logf("cross-namespace offer with no live nonce (forged, replayed or late); refused")
		o.drop()
	}
	return true
}

// clientWentOn reports whether the client of tc, whose PROPOSAL was read, has sent more bytes
// or ended its stream (one look, without waiting): a client that proposed sends nothing until
// answered unless it stopped waiting and went on over plain TCP (spec/WIRE.md section 11, step
// 3), and then sends no HELLO.
func clientWentOn(tc *net.TCPConn) bool {
	rc, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	b := make([]byte, 1)
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		_, _, rerr = unix.Recvfrom(int(fd), b, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return rerr != unix.EINTR
	}); err != nil {
		return false
	}
	return rerr != unix.EAGAIN
}

// netnsClaim runs before Accept returns tc, a connection from another namespace: answers its
// PROPOSAL, if it opens with one, and claims the offer that proves it. nil: plain TCP.
func (l *Listener) netnsClaim(tc *net.TCPConn) *Conn {
	s := l.netns
	p := make([]byte, netnsProposalLen)
	boot := []byte(nil)
	if s != nil {
		boot = s.boot
	} else if b, err := bootID(); err == nil {
		boot = b // configured without a rendezvous of our own: DECLINE what comes
	}
	tc.SetReadDeadline(time.Now().Add(netnsWait()))
	// The start of a PROPOSAL: the socket is waited on for the rest only (SO_RCVLOWAT: readable
	// once a whole PROPOSAL is there, or at the peer's end), not looked at in a loop; put back
	// (an accepted socket has its listener's) before the connection goes on.
	lowat, was := false, 0
	defer func() {
		if lowat {
			setRecvLowat(tc, was)
		}
	}()
	for {
		n, err := peekTCP(tc, p)
		if err != nil || n == 0 {
			tc.SetReadDeadline(time.Time{})
			return nil
		}
		if m := min(n, 8); !bytes.Equal(p[:m], netnsMagic[:m]) || (n >= 10 && p[8] != netnsProposalTyp) {
			tc.SetReadDeadline(time.Time{})
			return nil
		}
		if n == netnsProposalLen {
			break
		}
		if !lowat {
			if was = recvLowat(tc); was > 0 {
				lowat = setRecvLowat(tc, netnsProposalLen)
			}
		}
		if !lowat {
			time.Sleep(200 * time.Microsecond)
			continue
		}
		// The rest never comes after the peer's end (its bytes go on as sent); otherwise one
		// wait for readability (the deadline ends it).
		if peerEnded(tc) || waitReadable(tc) != nil {
			tc.SetReadDeadline(time.Time{})
			return nil
		}
	}
	// The whole PROPOSAL is queued: taking it cannot wait, even past the deadline.
	tc.SetReadDeadline(time.Time{})
	if _, err := io.ReadFull(tc, p); err != nil {
		return nil
	}
	ra := tc.RemoteAddr()
	send := func(kind, reason byte, nonce []byte, name string) error {
		a := make([]byte, netnsAnswerLen)
		copy(a, netnsMagic)
		a[8], a[9], a[10], a[11] = kind, Version, reason, byte(len(name))
		copy(a[16:32], boot)
		copy(a[32:48], nonce)
		copy(a[48:], name)
		tc.SetWriteDeadline(time.Now().Add(carrierAnswerTimeout))
		defer tc.SetWriteDeadline(time.Time{})
		_, err := tc.Write(a)
		return err
	}
	decline := func(reason byte, why string) *Conn {
		send(netnsDecline, reason, nil, "")
		logf("accept %v: cross-namespace proposal declined: %s; plain TCP", ra, why)
		return nil
	}
	switch {
	case s == nil:
		return decline(3, "no rendezvous of this listener (COLO_NETNS_DIR not writable?)")
	case p[9] != Version:
		return decline(1, "version")
	case !bytes.Equal(p[16:32], s.boot):
		return decline(2, "another boot (another host)")
	case clientWentOn(tc):
		return decline(3, "the client went on without waiting for the answer")
	}
	var k [24]byte
	copy(k[:8], p[32:40])
	if _, err := rand.Read(k[8:]); err != nil {
		return decline(3, "no random bytes")
	}
	ch := make(chan *offer, 1)
	s.mu.Lock()
	if len(s.pending) >= netnsMaxPending {
		s.mu.Unlock()
		return decline(3, "too many handshakes under way")
	}
	s.pending[k] = ch
	s.mu.Unlock()
	giveUp := func() *Conn {
		s.mu.Lock()
		delete(s.pending, k)
		drainNetns(ch)
		s.mu.Unlock()
		return nil
	}
	if send(netnsAccept, 0, k[8:], s.name) != nil {
		return giveUp()
	}
	t := time.NewTimer(carrierAnswerTimeout)
	defer t.Stop()
	var o *offer
	select {
	case o = <-ch:
	case <-t.C:
		logf("accept %v: no proved offer in time; plain TCP", ra)
		return giveUp()
	case <-l.done:
		return giveUp()
	}
	// Exactly one of this CAS and the client's OFFERED -> ABANDONED wins. SYNC POINT with the
	// client's CompareAndSwap of claim (netnsDial, and the Rust client's abandon).
	if !atomic.CompareAndSwapUint32(u32at(o.c.seg, hClaim), ClaimOffered, ClaimClaimed) {
		o.drop()
		close(o.claimed)
		return nil
	}
	logf("accept %v: shared memory (other namespace)", ra)
	return l.claimed(tc, o, tc.LocalAddr().(*net.TCPAddr), tc.RemoteAddr().(*net.TCPAddr))
}

// openToAll sets mode 0666 on the socket file just bound at path, never on anything else:
// whoever may write in the directory can rename the socket away and put a symbolic link to any
// file under its name between the bind and this call, and chmod(2) by name follows links. So the
// entry is opened without following one (O_PATH|O_NOFOLLOW), must be a socket with one link (a
// hard link of another socket, where the system allows linking others' files, has two) owned by
// us, and its mode is set through that descriptor (/proc/self/fd/N reaches exactly the opened
// inode). Another socket of ours swapped in meanwhile gets the mode, harmlessly.
func openToAll(path string) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Nlink != 1 || int(st.Uid) != os.Geteuid() {
		return errors.New("the rendezvous socket was replaced after bind")
	}
	return unix.Chmod(fmt.Sprintf("/proc/self/fd/%d", fd), 0o666)
}

// sweepStale removes from dir the rendezvous of servers that are gone: each colo-*.live that no
// live process holds write-locked (holdLive locks its file before the file takes its name), and
// the socket of the same stem. A killed server leaves both, and every client's connect looks
// through the directory; a server that binds sweeps them up.
func sweepStale(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		stem, ok := strings.CutSuffix(e.Name(), netnsLiveSuffix)
		if !ok || !strings.HasPrefix(stem, netnsPrefix) || !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		stale := !writeLocked(fd)
		unix.Close(fd)
		if stale {
			os.Remove(filepath.Join(dir, stem))
			os.Remove(path)
		}
	}
}
