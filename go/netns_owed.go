package colo

// A plain TCP connection across network namespaces that owes the answer to its PROPOSAL
// (spec/WIRE.md section 11, step 3): netnsDial stopped waiting for it and went on, as a late
// accept over TCP is no failure. The server sends that answer (netnsAnswerLen bytes from the
// magic, ACCEPT or DECLINE alike) before any byte of its program, whenever the program gets to
// the connection, and the client sent nothing but the PROPOSAL before it stopped waiting; so
// the answer, if any comes, is the first thing on the stream. Read takes it off before the
// application reads a byte. A late answer never accelerates the connection.

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// takeOwed runs before a Read of c (plain TCP, c.owed set by netnsDial). It looks at the head of
// the stream, taking nothing, until the head begins with a whole answer (taken off: exactly
// netnsAnswerLen bytes), or with bytes that are not one (a server that is not colo), or the
// stream ended or failed (nothing taken; the Read reports it); then it clears c.owed. Meanwhile
// it waits as the Read would wait for bytes: in the netpoller, until the connection's read
// deadline or Close, whose error (os.ErrDeadlineExceeded, net.ErrClosed) it returns as Read
// would, the answer still owed. A head holding part of an answer that does not grow for
// carrierWait is no answer. owedMu serializes concurrent Reads: the second finds c.owed
// cleared, or waits its turn.
func (c *Conn) takeOwed() error {
	c.owedMu.Lock()
	defer c.owedMu.Unlock()
	rc, err := c.tcp.SyscallConn()
	if err != nil {
		c.owed.Store(false)
		return nil
	}
	a := make([]byte, netnsAnswerLen)
	for c.owed.Load() {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			for {
				n, _, rerr = unix.Recvfrom(int(fd), a, unix.MSG_PEEK|unix.MSG_DONTWAIT)
				if rerr != unix.EINTR {
					return rerr != unix.EAGAIN
				}
			}
		}); err != nil {
			var oe *net.OpError
			if errors.As(err, &oe) {
				err = oe.Err
			}
			return &net.OpError{Op: "read", Net: "tcp", Source: c.tcp.LocalAddr(), Addr: c.tcp.RemoteAddr(), Err: err}
		}
		m := min(n, 8)
		switch {
		case rerr != nil || n == 0 || !bytes.Equal(a[:m], netnsMagic[:m]) || !netnsIsAnswer(a[:n]):
			// Failed, ended, or not an answer: none will come.
			c.owed.Store(false)
			logf("dial %v: cross-namespace: the late answer never came; plain TCP", c.tcp.RemoteAddr())
		case n == netnsAnswerLen:
			// Queued whole, and no other Read of c runs (owedMu): the receive takes exactly it.
			rc.Control(func(fd uintptr) { unix.Recvfrom(int(fd), a, unix.MSG_DONTWAIT) })
			c.owed.Store(false)
			logf("dial %v: cross-namespace: the late answer (type %d) taken off the stream; plain TCP", c.tcp.RemoteAddr(), a[8])
		default:
			if c.owedPartial.IsZero() {
				c.owedPartial = time.Now()
			}
			if peerEnded(c.tcp) || time.Since(c.owedPartial) >= carrierWait() {
				c.owed.Store(false)
				logf("dial %v: cross-namespace: the stream begins with part of an answer that never grew; plain TCP", c.tcp.RemoteAddr())
				break
			}
			// Readable already (the part): a wait in the netpoller would return at once. The
			// next look checks the read deadline first.
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// lateFor is how long dials to a server whose program left a PROPOSAL unanswered go plain TCP
// without one: its next connections would only wait the same way (a server busy or stopped).
const lateFor = time.Second

// lateServers are the servers found late, and until when; a few at a time.
var lateServers lateTable

type lateTable struct {
	mu    sync.Mutex
	until map[netip.AddrPort]time.Time
}

// mark records that the server at ap left a PROPOSAL unanswered past the wait.
func (t *lateTable) mark(ap netip.AddrPort) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	for a, u := range t.until {
		if !u.After(now) {
			delete(t.until, a)
		}
	}
	if t.until == nil {
		t.until = make(map[netip.AddrPort]time.Time)
	}
	if len(t.until) < 64 {
		t.until[ap] = now.Add(lateFor)
	}
}

// recently reports whether the server at ap was found late within the last lateFor.
func (t *lateTable) recently(ap netip.AddrPort) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	u, ok := t.until[ap]
	return ok && time.Now().Before(u)
}

// netnsIsAnswer reports whether head, the first bytes of a stream that begin with the magic, can
// begin an answer: its type, once there, is ACCEPT or DECLINE (a server that is not colo may
// echo the PROPOSAL, which begins with the magic too).
func netnsIsAnswer(head []byte) bool {
	return len(head) <= 8 || head[8] == netnsAccept || head[8] == netnsDecline
}
