package colo

// The client side of colo across network namespaces (spec section 11): a destination listed in
// COLO_NETNS_PEERS whose directory holds a live colo listener gets a PROPOSAL as the first bytes
// of its TCP connection; on ACCEPT the client offers its segment (the section 3 CARRIER HELLO,
// flag NETNS, both nonces in the header) at the rendezvous the answer names. Without the
// configuration nothing here runs. The listener's side is in netns_server.go.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

var netnsMagic = []byte("\x00COLO-NS")

const (
	netnsProposalLen = 40
	netnsAnswerLen   = 112
	netnsAccept      = 2
	netnsNameMax     = 64
	netnsPrefix      = "colo-"
	netnsLiveSuffix  = ".live"
	flagNetns        = 2
	hProof           = 104 // the proof's offset in the segment header: client nonce, server nonce
)

type netnsRule struct {
	net  netip.Prefix
	port int // -1: any
	dir  string
}

var netnsRules = sync.OnceValue(func() []netnsRule {
	return parseNetnsRules(os.Getenv("COLO_NETNS_PEERS"), os.Getenv("COLO_NETNS_PEER_DIR"))
})

// parseNetnsRules reads comma-separated DEST[=DIR] entries: a network, an address, or an
// address and port; DIR defaults to def. Malformed entries are skipped.
func parseNetnsRules(spec, def string) []netnsRule {
	var out []netnsRule
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		dest, dir, found := strings.Cut(item, "=")
		if !found {
			dir = def
		}
		dest, dir = strings.TrimSpace(dest), strings.TrimSpace(dir)
		if dir == "" {
			logf("COLO_NETNS_PEERS: %s: no directory; skipped", item)
			continue
		}
		r := netnsRule{port: -1, dir: dir}
		if p, err := netip.ParsePrefix(dest); err == nil {
			r.net = p.Masked()
		} else if ap, err := netip.ParseAddrPort(dest); err == nil {
			r.net, r.port = netip.PrefixFrom(ap.Addr().Unmap(), ap.Addr().Unmap().BitLen()), int(ap.Port())
		} else if a, err := netip.ParseAddr(dest); err == nil {
			r.net = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		} else {
			logf("COLO_NETNS_PEERS: %s: not a network, address or address:port; skipped", item)
			continue
		}
		out = append(out, r)
	}
	return out
}

// lockLive takes a write lock on all of the file fd (open for writing), an open file
// description lock (F_OFD_SETLK, F_WRLCK), held until its last descriptor closes: while it is
// held, the rendezvous of the same name is served. Only a descriptor open for writing can take
// it, so a reader of the directory (a read-only mount) cannot fake a dead server's liveness, as
// it could with flock or a read lock.
func lockLive(fd int) error {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0} // Start 0, Len 0: the whole file
	return unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk)
}

// holdLive creates path (a .live file) write-locked (lockLive) and returns its descriptor. The
// file is a fresh one, locked under a name of its own and renamed over path: a reader of the
// directory may hold a read lock on the file a dead server of the same name left (a
// container's server is pid 1 at every start), which would keep the lock from being had.
func holdLive(path string) (int, error) {
	var err error
	for range 8 {
		var r [8]byte
		if _, err = rand.Read(r[:]); err != nil {
			return -1, err
		}
		tmp := fmt.Sprintf("%s.%d", path, binary.LittleEndian.Uint64(r[:]))
		fd, oerr := unix.Open(tmp, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o644)
		if oerr != nil {
			return -1, oerr
		}
		if err = lockLive(fd); err != nil {
			// A reader opened the fresh file and read-locked it first: another name.
			unix.Close(fd)
			unix.Unlink(tmp)
			continue
		}
		if err = unix.Rename(tmp, path); err != nil {
			unix.Close(fd)
			unix.Unlink(tmp)
			return -1, err
		}
		return fd, nil
	}
	return -1, err
}

// writeLocked reports whether another open file description holds a write lock on fd's file
// (lockLive): F_OFD_GETLK asks whether a read lock could be taken, which only a write lock
// prevents; a read-only fd is enough.
func writeLocked(fd int) bool {
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: 0}
	return unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk) == nil && lk.Type == unix.F_WRLCK
}

// liveListener reports whether dir holds a served rendezvous (its .live file write-locked by a
// live process: lockLive) for port, or for any port when port is -1.
func liveListener(dir string, port int) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		stem, ok := strings.CutPrefix(e.Name(), netnsPrefix)
		if !ok {
			continue
		}
		if stem, ok = strings.CutSuffix(stem, netnsLiveSuffix); !ok {
			continue
		}
		i := strings.LastIndexByte(stem, '-')
		p, err := strconv.Atoi(stem[i+1:])
		if i < 0 || err != nil || (port >= 0 && p != port) {
			continue
		}
		fd, err := unix.Open(filepath.Join(dir, e.Name()), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		if err != nil {
			continue
		}
		live := writeLocked(fd)
		unix.Close(fd)
		if live {
			return true
		}
	}
	return false
}

// netnsPeerDir is the directory of the listener serving ap in another namespace, if ap is
// configured and a live listener is there (spec section 11).
func netnsPeerDir(ap netip.AddrPort) (string, bool) {
	ip := ap.Addr().Unmap()
	for _, r := range netnsRules() {
		if (r.port >= 0 && r.port != int(ap.Port())) || !r.net.Contains(ip) {
			continue
		}
		want := int(ap.Port())
		if r.port >= 0 {
			want = -1
		}
		if liveListener(r.dir, want) {
			return r.dir, true
		}
	}
	return "", false
}

func validRendezvousName(n []byte) bool {
	if len(n) < 1 || len(n) > netnsNameMax || string(n) == "." || string(n) == ".." {
		return false
	}
	for _, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func bootID() ([]byte, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return nil, err
	}
	id, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(string(b)), "-", ""))
	if err != nil || len(id) != 16 {
		return nil, errors.New("boot id is not a UUID")
	}
	return id, nil
}

// peekTCP reads up to len(b) bytes queued on tc without taking them, waiting (until the
// connection's read deadline) while nothing is queued. Once the deadline has passed it reports
// it, unless all of b is queued: a deadline that passed while the caller waited for a CPU (the
// netpoller reports it before looking at the socket) does not hide a whole message that came in
// time, which a caller that gave up would leave at the head of the application's stream.
func peekTCP(tc *net.TCPConn, b []byte) (int, error) {
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var rerr error
	peek := func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), b, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return rerr != unix.EAGAIN
	}
	if err = rc.Read(peek); errors.Is(err, os.ErrDeadlineExceeded) {
		if cerr := rc.Control(func(fd uintptr) { peek(fd) }); cerr == nil && rerr == nil && n == len(b) {
			return n, nil
		}
	}
	if err != nil {
		return 0, err
	}
	return n, rerr
}

// setRecvLowat sets the socket's SO_RCVLOWAT; whether the kernel took it.
func setRecvLowat(tc *net.TCPConn, n int) bool {
	rc, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, n)
	}); err != nil {
		return false
	}
	return serr == nil
}

// recvLowat is the socket's SO_RCVLOWAT, at least 1 (the kernel reads 0 as 1); 0 if it cannot
// be read.
func recvLowat(tc *net.TCPConn) int {
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0
	}
	v := 0
	rc.Control(func(fd uintptr) {
		if n, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT); err == nil {
			v = max(n, 1)
		}
	})
	return v
}

// peerEnded reports whether the peer shut its sending side down or the connection failed (one
// poll, no wait; reported whatever SO_RCVLOWAT says).
func peerEnded(tc *net.TCPConn) bool {
	rc, err := tc.SyscallConn()
	if err != nil {
		return true
	}
	ended := false
	rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(p, 0); err == nil && n == 1 {
			ended = p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
		}
	})
	return ended
}

// waitReadable waits in the netpoller until the socket is readable (as SO_RCVLOWAT counts) or
// ended, or its read deadline passes. Readiness is first looked at with poll, after the
// netpoller forgot earlier reports, so bytes that came just before are not missed; a wake-up
// with nothing new only makes the caller look again.
func waitReadable(tc *net.TCPConn) error {
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	first := true
	return rc.Read(func(fd uintptr) bool {
		if !first {
			return true
		}
		first = false
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
		n, err := unix.Poll(p, 0)
		return err != nil || n > 0
	})
}

// netnsProposal is the PROPOSAL: magic, type 1, version, boot id, client nonce.
func netnsProposal(boot, clientNonce []byte) []byte {
	prop := make([]byte, netnsProposalLen)
	copy(prop, netnsMagic)
	prop[8], prop[9] = 1, Version
	copy(prop[16:32], boot)
	copy(prop[32:40], clientNonce)
	return prop
}

// carrierWait bounds a client's wait for its server's program to get to the connection: for
// the answer to its PROPOSAL (another namespace) or the claim of its CARRIER offer (this one),
// and how long the head of an owed answer's stream may hold part of one (COLO_CARRIER_TIMEOUT_MS,
// 500 ms, as the Rust core and the shim read it).
var carrierWait = sync.OnceValue(func() time.Duration {
	if ms, err := strconv.Atoi(os.Getenv("COLO_CARRIER_TIMEOUT_MS")); err == nil && ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return 500 * time.Millisecond
})

// netnsDial connects to ap, a listener in another namespace with its rendezvous in dir, and
// proposes shared memory. A nil *Conn with a nil error does not happen: the connection is
// plain TCP (on the same TCP connection) whenever shared memory is not had. An answer that does
// not come within carrierWait is not a failure (a server whose program accepts late, as over
// TCP): the connection goes on over plain TCP and owes the answer, which its server sends first
// on the stream whenever its program gets to the connection and which Read takes off before any
// byte of the application (spec/WIRE.md section 11, step 3; netns_owed.go).
func netnsDial(ctx context.Context, network string, ap netip.AddrPort, dir string, g Geometry) (*Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, ap.String())
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	if lateServers.recently(ap) {
		logf("dial %v: cross-namespace: its server did not answer in time a moment ago; plain TCP", ap)
		return &Conn{tcp: tc}, nil
	}
	plain := func(why string, args ...any) (*Conn, error) {
		logf("dial %v: cross-namespace: "+why+"; plain TCP", append([]any{ap}, args...)...)
		return &Conn{tcp: tc}, nil
	}
	boot, err := bootID()
	if err != nil {
		return plain("%v", err)
	}
	dirfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return plain("%s: %v", dir, err)
	}
	defer unix.Close(dirfd)
	var dst unix.Stat_t
	if err := unix.Fstat(dirfd, &dst); err != nil {
		return plain("%s: %v", dir, err)
	}
	if err := g.valid(); err != nil {
		return plain("%v", err)
	}
	clientNonce := make([]byte, 8)
	if _, err := rand.Read(clientNonce); err != nil {
		return plain("random: %v", err)
	}
	prop := netnsProposal(boot, clientNonce)
	start := time.Now()
	dl := start.Add(carrierWait())
	if cdl, ok := ctx.Deadline(); ok && cdl.Before(dl) {
		dl = cdl
	}
	broken := func(err error) (*Conn, error) {
		tc.Close()
		return nil, err
	}
	tc.SetDeadline(dl)
	if _, err := tc.Write(prop); err != nil {
		return broken(err)
	}
	a := make([]byte, netnsAnswerLen)
	for {
		n, err := peekTCP(tc, a)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Nothing was taken off the stream and nothing more was sent: the answer, when it
			// comes, is the first thing on it.
			tc.SetDeadline(time.Time{})
			logf("dial %v: cross-namespace: no answer within %v (its server's program has not accepted the connection); plain TCP, the answer taken off the stream when it comes, and plain TCP there for a second", ap, dl.Sub(start).Round(time.Millisecond))
			lateServers.mark(ap)
			c := &Conn{tcp: tc}
			c.owed.Store(true) // before c is shared: no reader yet
			return c, nil
		}
		if err != nil {
			return broken(&net.OpError{Op: "dial", Net: network, Source: tc.LocalAddr(), Addr: tc.RemoteAddr(), Err: err})
		}
		if n == 0 {
			tc.SetDeadline(time.Time{})
			return plain("the server closed the connection")
		}
		if m := min(n, 8); !bytes.Equal(a[:m], netnsMagic[:m]) || !netnsIsAnswer(a[:n]) {
			tc.SetDeadline(time.Time{})
			return plain("the server is not colo")
		}
		if n == netnsAnswerLen {
			break
		}
		time.Sleep(200 * time.Microsecond)
	}
	tc.SetDeadline(time.Time{}) // the whole answer is queued: taking it cannot wait
	if _, err := io.ReadFull(tc, a); err != nil {
		return broken(err)
	}
	if a[8] != netnsAccept {
		return plain("declined (reason %d)", a[10])
	}
	if !bytes.Equal(a[16:32], boot) {
		return plain("the server runs on another boot")
	}
	name := a[48 : 48+min(int(a[11]), netnsNameMax)]
	if int(a[11]) > netnsNameMax || !validRendezvousName(name) {
		return plain("the server named a rendezvous outside its directory")
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, string(name), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return plain("rendezvous %s is not a socket", name)
	}
	wait := carrierAnswerTimeout
	if cdl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(cdl))
	}
	fd, err := connectRendezvousPath("/proc/self/fd/"+strconv.Itoa(dirfd)+"/"+string(name), wait)
	if err != nil {
		return plain("rendezvous: %v", err)
	}
	cs := &clientSide{ctl: os.NewFile(uintptr(fd), "colo-ctl"), fd: fd}
	if cs.cred, err = peerCred(fd); err != nil {
		cs.close()
		return plain("rendezvous credentials: %v", err)
	}
	if u := cs.cred.Uid; u != 0 && u != dst.Uid && u != uint32(os.Getuid()) {
		cs.close()
		return plain("rendezvous of uid %d, directory of uid %d", u, dst.Uid)
	}
	if cs.segRes, err = takeSeg(g); err != nil {
		cs.close()
		return plain("%v", err)
	}
	cs.proof = append(append([]byte{}, clientNonce...), a[32:48]...)
	la := tc.LocalAddr().(*net.TCPAddr).AddrPort()
	h := header{Claim: ClaimOffered, ClientAddr: canonical(la), ServerAddr: canonical(ap)}
	if err := cs.hello(h, ModeCarrier); err != nil {
		cs.close()
		return plain("offer: %v", err)
	}
	if aerr := cs.answer(ctx, time.Now().Add(carrierAnswerTimeout)); aerr != nil {
		// Exactly one of this CAS and the server's OFFERED -> CLAIMED wins. SYNC POINT with the
		// server's compare-and-swap of claim (spec section 3, step 2).
		if atomic.CompareAndSwapUint32(u32at(cs.seg, hClaim), ClaimOffered, ClaimAbandoned) {
			cs.close() // nothing was written into the ring: nothing to copy into the TCP socket
			return plain("offer not taken (%v)", aerr)
		}
		if aerr = cs.answer(context.Background(), time.Now().Add(carrierAnswerTimeout)); aerr != nil {
			cs.close()
			return broken(aerr)
		}
	}
	conn := cs.conn(tc.LocalAddr().(*net.TCPAddr), tc.RemoteAddr().(*net.TCPAddr))
	conn.carrier = tc
	logf("dial %v: shared memory (other namespace)", ap)
	return conn, nil
}

// errRendezvousFull: the rendezvous's backlog stayed full for all of the connect's wait.
var errRendezvousFull = errors.New("rendezvous backlog full")

// connectRendezvousPath connects a close-on-exec SOCK_SEQPACKET socket to path, waiting
// at most wait for room in the listener's backlog, which anyone who reaches the socket can fill
// with connections the server has not accepted yet. A Unix socket's connect waits for that room
// bounded by SO_SNDTIMEO alone (a non-blocking one fails at once with EAGAIN, with nothing to
// poll for); the timeout is cleared again once connected, and the socket made non-blocking (it
// becomes the connection's doorbell, which waits in the netpoller).
func connectRendezvousPath(path string, wait time.Duration) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	refuseRights(fd) // our control socket takes no descriptor, ever (spec section 6)
	tv := unix.NsecToTimeval(max(wait, time.Millisecond).Nanoseconds())
	if err = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err == nil {
		for {
			if err = unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != unix.EINTR {
				break
			}
		}
		if err == unix.EAGAIN {
			err = errRendezvousFull
		}
	}
	if err == nil {
		err = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{})
	}
	if err == nil {
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// netnsTarget resolves address to the first configured cross-namespace destination, if any.
func netnsTarget(ctx context.Context, network, address string) (netip.AddrPort, string, bool) {
	if len(netnsRules()) == 0 {
		return netip.AddrPort{}, "", false
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return netip.AddrPort{}, "", false
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, "", false
	}
	family := "ip"
	switch network {
	case "tcp4":
		family = "ip4"
	case "tcp6":
		family = "ip6"
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, family, host)
	if err != nil || len(ips) == 0 {
		return netip.AddrPort{}, "", false
	}
	ap := netip.AddrPortFrom(ips[0].Unmap(), uint16(p))
	dir, ok := netnsPeerDir(ap)
	return ap, dir, ok
}
