package colo

// The control socket after the handshake (spec/WIRE.md sections 1, 3, 6 and 8): the connection's
// doorbell (a one-byte datagram is a ring), its hang-up the peer's close or death, and the late
// answer of a pending client's server arrives on it first.

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ctlDrainCalls bounds one drainCtl: a peer that keeps ringing cannot keep us there. An honest
// peer rings at most once per announcement, so a drain empties its queue long before the bound.
const ctlDrainCalls = 16

// What one receive from a control socket after the handshake got (spec section 6, "Ringing and
// draining").
const (
	gotNothing = iota // nothing queued (EAGAIN, EINTR)
	gotRing           // a one-byte datagram without descriptors
	gotMsg            // a 16-byte datagram without descriptors: a handshake message
	gotHangUp         // 0 (the peer's end shut down or closed, or an empty datagram) or an error
	gotGarbage        // any other datagram, or one with descriptors
)

// recvCtl receives one datagram from the control socket fd with MSG_DONTWAIT (never blocking)
// and says what it was; a 16-byte one is copied into m. Descriptors a peer sends along are
// received (room for all one message carries: the kernel would otherwise drop them in this
// thread, and a lingering socket's last close waits there) and closed disarmed, never kept.
//
// A raw system call: it never blocks, so the scheduler need not hand our P away for it.
func recvCtl(fd int, m *[msgSize]byte) int {
	var b [msgSize + 1]byte // one byte more than a message: a longer datagram is truncated
	var oob [rightsOOB]byte
	iov := unix.Iovec{Base: &b[0]}
	iov.SetLen(len(b))
	msg := unix.Msghdr{Iov: &iov, Iovlen: 1, Control: &oob[0]}
	msg.SetControllen(len(oob))
	n, _, e := unix.RawSyscall(unix.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)),
		unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
	switch {
	case e == unix.EAGAIN || e == unix.EINTR:
		return gotNothing
	case e != 0:
		return gotHangUp
	case msg.Controllen > 0:
		closeRights(oob[:msg.Controllen])
	}
	k := ctlKind(int(n), msg.Flags, msg.Controllen > 0)
	if k == gotMsg {
		copy(m[:], b[:msgSize])
	}
	return k
}

// mmsghdr is struct mmsghdr (recvmmsg(2)): Go pads it to the C layout on every architecture.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// ctlBatch is what one recvmmsg of a drain receives into.
type ctlBatch struct {
	hdrs [ctlDrainCalls]mmsghdr
	iovs [ctlDrainCalls]unix.Iovec
	bufs [ctlDrainCalls][msgSize + 1]byte // a byte more than a message: a longer one is truncated
}

// recvCtlBatch receives up to ctlDrainCalls datagrams from the control socket fd in one system
// call (recvmmsg with MSG_DONTWAIT: never blocking), without room for descriptors: only for a
// socket that refuses them (SO_PASSRIGHTS 0), where none can be queued. It returns how many it
// received, or the error of the first receive.
func recvCtlBatch(fd int, b *ctlBatch) (int, unix.Errno) {
	for i := range b.hdrs {
		b.iovs[i] = unix.Iovec{Base: &b.bufs[i][0]}
		b.iovs[i].SetLen(len(b.bufs[i]))
		b.hdrs[i].hdr = unix.Msghdr{Iov: &b.iovs[i], Iovlen: 1}
	}
	n, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])),
		ctlDrainCalls, unix.MSG_DONTWAIT, 0, 0)
	return int(n), e
}

// ctlKind says what a received datagram of n bytes with the given msg_flags is (spec section 6).
func ctlKind(n int, flags int32, rights bool) int {
	switch {
	case rights || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
		return gotGarbage
	case n == 0:
		return gotHangUp
	case n == 1:
		return gotRing
	case n == msgSize:
		return gotMsg
	}
	return gotGarbage
}

// drainCtl drains our doorbell, the control socket: at most ctlDrainCalls datagrams, until it
// would block. A socket that refuses descriptors (rightsOff) is drained with one system call,
// others one datagram at a time, each with room for descriptors. Rings mean nothing; the
// server's answer to a pending client is handled as section 3 says (a late WELCOME changes
// nothing, a late REJECT fails the connection with ECONNREFUSED); the hang-up sets ctlGone;
// anything else is a protocol error, which resets the connection. It reports whether it stopped at its bound with more queued: no edge may come
// for what is queued, so the caller re-checks instead of sleeping.
//
// Only the poller (one at a time) and Close (alone) call it, with the life lock held, so the
// socket is open and pending is ours alone.
func (c *Conn) drainCtl() (more bool) {
	var m [msgSize]byte
	var b ctlBatch
	got := 0
	if c.rightsOff {
		var e unix.Errno
		if got, e = recvCtlBatch(c.ctlFd, &b); e == unix.EAGAIN || e == unix.EINTR {
			return false
		} else if e != 0 {
			got = -1 // the hang-up
		}
	}
	for i := 0; i < ctlDrainCalls; i++ {
		var k int
		switch {
		case !c.rightsOff:
			k = recvCtl(c.ctlFd, &m)
		case got < 0:
			k = gotHangUp
		case i >= got:
			return false
		default:
			k = ctlKind(int(b.hdrs[i].n), b.hdrs[i].hdr.Flags, false)
			copy(m[:], b.bufs[i][:msgSize])
		}
		switch k {
		case gotNothing:
			return false
		case gotRing:
		case gotMsg:
			if !c.pending.Load() {
				c.fail(errnoErr("read", unix.ECONNRESET), true)
				return false
			}
			c.pending.Store(false)
			if !c.lateAnswer(m[:]) {
				return false
			}
		case gotHangUp:
			// SYNC POINT with the Loads of ctlGone in the ready conditions, readSome and
			// cleanClose: the peer's flags and ring_head stores precede its hang-up, so an
			// operation that sees ctlGone sees them too. Set before the poller's re-check; its
			// followers re-check when its poll ends.
			c.ctlGone.Store(true)
			return false
		default:
			c.fail(errnoErr("read", unix.ECONNRESET), true)
			return false
		}
	}
	return true
}

// lateAnswer handles the answer a pending client reads after its dial returned (spec section 3);
// false if it failed the connection.
func (c *Conn) lateAnswer(b []byte) bool {
	m, err := decodeMsg(b)
	switch {
	case err == nil && m.Type == MsgWelcome && m.Version == Version:
		if c.welcomeName != "" {
			welcomed.Store(c.welcomeName, int32(c.peerPid))
		}
		return true
	case err == nil && m.Type == MsgReject:
		logf("late %v", &RejectError{Reason: m.Arg, Version: m.Version})
		c.fail(errnoErr("read", unix.ECONNREFUSED), true)
	default:
		c.fail(errnoErr("read", unix.ECONNRESET), true)
	}
	return false
}

// emptyCtlBeforeClose shuts the control socket down and takes what it still holds (a socket
// closed with a descriptor queued releases it in the closing thread, undisarmed: spec section
// 6). Shut down first, nothing more can be queued on it.
func emptyCtlBeforeClose(fd int) {
	unix.Shutdown(fd, unix.SHUT_RDWR)
	drainAll(fd)
}
