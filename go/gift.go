package colo

import (
	"math"

	"golang.org/x/sys/unix"
)

// Descriptors a peer passes us (as rust/colo-sys/src/gift.rs). disarm turns a socket's lingering
// off, but a Unix socket's last close releases what its queue holds, in the closing thread,
// undisarmed: one may be a lingering TCP socket whose close waits as long as its maker likes
// (here: an OS thread the runtime replaces, up to its limit of threads). And SO_PASSRIGHTS is
// the receiving socket's own option: a server's doorbell end is a socket the client made, and a
// client that kept a copy of it turns descriptors back on. So a Unix socket we do not keep is
// shut down (nothing can be queued on it, or connect to it, from then on, whoever holds it) and
// emptied before its close, each descriptor in its queue discarded the same way (discardFd);
// one we keep has what it holds taken at once (takeQueued), and a doorbell end is emptied
// before its close, and shut down first if found taking descriptors (emptyBellBeforeClose).

// inlineSockets and inlineRights bound what one discardFd empties on its caller's goroutine; a
// goroutine of its own empties the rest.
const (
	inlineSockets = 16
	inlineRights  = 512
)

func isUnixSocket(fd int) bool {
	d, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	return err == nil && d == unix.AF_UNIX
}

// rightsOn reports whether the Unix socket fd takes descriptors (false where the kernel does
// not know SO_PASSRIGHTS).
func rightsOn(fd int) bool {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, soPassRights)
	return err == nil && v != 0
}

// discardFd closes a descriptor a peer passed us and we do not keep, so that its close never
// waits: disarmed, and a Unix socket shut down and emptied first.
func discardFd(fd int) {
	disarm(fd)
	if !isUnixSocket(fd) {
		unix.Close(fd)
		return
	}
	if rest := emptyAll([]int{fd}, inlineSockets, inlineRights); len(rest) > 0 {
		go emptyAll(rest, math.MaxInt, math.MaxInt)
	}
}

// emptyAll empties and closes the Unix sockets of work and those found in their queues, at most
// sockets of them and rights descriptors taken; it returns those left.
func emptyAll(work []int, sockets, rights int) []int {
	done, taken := 0, 0
	for len(work) > 0 {
		if done >= sockets || taken >= rights {
			return work
		}
		u := work[len(work)-1]
		work = work[:len(work)-1]
		n, all := emptySocket(u, &work, rights-taken)
		taken += n
		if !all {
			return append(work, u)
		}
		done++
		unix.Close(u)
	}
	return nil
}

// emptySocket shuts the Unix socket u down both ways and takes what it holds: each descriptor
// disarmed, a Unix socket among them added to work, anything else closed; a listening socket's
// pending connections added to work. It reports how many it took, and false if it stopped at
// max with more queued.
func emptySocket(u int, work *[]int, max int) (int, bool) {
	unix.Shutdown(u, unix.SHUT_RDWR)
	taken := 0
	if v, err := unix.GetsockoptInt(u, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err == nil && v != 0 {
		for ; taken < max; taken++ {
			c, _, err := unix.Accept4(u, unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
			if err != nil {
				return taken, true
			}
			*work = append(*work, c)
		}
		return taken, false
	}
	var b [256]byte
	oob := make([]byte, bellOOB)
	for taken < max {
		n, oobn, _, _, err := unix.Recvmsg(u, b[:], oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		if err != nil {
			return taken, true
		}
		got := rightsIn(oob[:oobn])
		for _, fd := range got {
			disarm(fd)
			if isUnixSocket(fd) {
				*work = append(*work, fd)
			} else {
				unix.Close(fd)
			}
		}
		taken += len(got)
		if n == 0 && len(got) == 0 { // shut down, an empty queue reads as its end
			return taken, true
		}
	}
	return taken, false
}

// takeQueued makes a Unix socket a peer passed us, and that we may keep (a doorbell end), refuse
// descriptors, and discards every descriptor queued on it before (its bytes, a doorbell's
// rings, are dropped: a side looks past them once it holds the connection).
func takeQueued(fd int) {
	refuseRights(fd)
	drainAll(fd)
}

// drainAll receives what fd holds (at most 1024 receives), discarding the descriptors.
func drainAll(fd int) {
	var b [256]byte
	oob := make([]byte, bellOOB)
	for i := 0; i < 1024; i++ {
		n, oobn, _, _, err := unix.Recvmsg(fd, b[:], oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		if err != nil {
			return
		}
		got := rightsIn(oob[:oobn])
		for _, g := range got {
			discardFd(g)
		}
		if n == 0 && len(got) == 0 {
			return
		}
	}
}

// emptyBellBeforeClose takes what our doorbell end holds before its close (a socket closed with
// a descriptor queued releases it in the closing thread); an end found taking descriptors (a
// client that kept a copy turned them back on) is shut down first and emptied again.
func emptyBellBeforeClose(fd int) {
	drainAll(fd)
	if rightsOn(fd) {
		unix.Shutdown(fd, unix.SHUT_RDWR)
		drainAll(fd)
	}
}

// rightsIn lists the descriptors carried in a control-message buffer.
func rightsIn(oob []byte) []int {
	if len(oob) == 0 {
		return nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if f, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

// takeBehind takes what a client queued on its rendezvous connection behind its HELLO (at most
// 64 messages, without waiting), discarding their descriptors; it returns how many it took (a
// hang-up is not one).
func takeBehind(fd int) int {
	var b [64]byte
	oob := make([]byte, bellOOB)
	taken := 0
	for ; taken < 64; taken++ {
		n, oobn, _, _, err := unix.Recvmsg(fd, b[:], oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		if err != nil || (n == 0 && oobn == 0) {
			break
		}
		closeRights(oob[:oobn])
	}
	return taken
}
