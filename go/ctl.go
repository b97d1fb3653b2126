package colo

// The control socket after the handshake (spec/WIRE.md sections 3 and 8): its hang-up is the
// peer's close or death, and the late answer of a pending client's server arrives on it.

import "golang.org/x/sys/unix"

// startWatch starts the control-socket watcher; call once the connection is fully set up.
func (c *Conn) startWatch() { go c.watchCtl() }

// watchCtl waits, parked in the netpoller, for the control socket to become readable after the
// handshake: hang-up is the peer's close or death; any byte or descriptor is a protocol
// violation (reset), except the server's answer to a pending client (spec section 3): a late
// WELCOME changes nothing, a late REJECT fails the connection with ECONNREFUSED. Blocked
// operations are woken. It returns when Close closes the socket.
func (c *Conn) watchCtl() {
	rc, err := c.ctl.SyscallConn()
	if err != nil {
		return
	}
	for {
		var buf [64]byte
		var n, oobn int
		var rerr error
		err = rc.Read(func(fd uintptr) bool {
			oob := make([]byte, unix.CmsgSpace(4*maxRights))
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf[:], oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
			if oobn > 0 {
				closeRights(oob[:oobn])
			}
			return rerr != unix.EAGAIN && rerr != unix.EINTR
		})
		if err != nil {
			return // closed by Close
		}
		// pending is Dial's store before this goroutine starts (the go statement orders it)
		// and this goroutine's own: it orders nothing else.
		if rerr == nil && oobn == 0 && n > 0 && c.pending.Load() {
			c.pending.Store(false)
			if m, derr := decodeMsg(buf[:n]); derr == nil {
				if m.Type == MsgWelcome && m.Version == Version {
					welcomed.Store(c.welcomeName, int32(c.peerPid))
					continue
				}
				if m.Type == MsgReject && c.enter() {
					logf("late %v", &RejectError{Reason: m.Arg, Version: m.Version})
					c.fail(errnoErr("read", unix.ECONNREFUSED), true)
					c.exit()
					break
				}
			}
		}
		if rerr == nil && (n > 0 || oobn > 0) && c.enter() {
			c.fail(errnoErr("read", unix.ECONNRESET), true)
			c.exit()
		}
		break // n == 0: hang-up (or an empty datagram, treated alike); other errors too
	}
	// SYNC POINT with the Loads of ctlGone in the ready conditions, readSome and cleanClose:
	// set before the kick, so every blocked operation sees it when it wakes. The peer's flags
	// and ring_head stores precede its hang-up, so a reader that sees ctlGone sees them too.
	c.ctlGone.Store(true)
	c.kick()
}
