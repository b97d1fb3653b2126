package colo

import (
	"math"

	"golang.org/x/sys/unix"
)

// Descriptors a peer passes us (as rust/colo-sys/src/gift.rs). disarm turns a socket's lingering
// off, but a Unix socket's last close releases what its queue holds, in the closing thread,
// undisarmed: one may be a lingering TCP socket whose close waits as long as its maker likes
// (here: an OS thread the runtime replaces, up to its limit of threads). So a Unix socket a peer
// passed us is shut down (nothing can be queued on it, or connect to it, from then on, whoever
// holds it) and emptied before its close, each descriptor in its queue discarded the same way
// (discardFd). We keep no socket a peer passed (a HELLO's one descriptor is a memfd), and our own
// control socket, which refuses descriptors where the kernel can (SO_PASSRIGHTS), is shut down
// and emptied before its close (emptyCtlBeforeClose).

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
	oob := make([]byte, rightsOOB)
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

// drainAll receives what fd holds (at most 1024 receives), discarding the descriptors.
func drainAll(fd int) {
	var b [256]byte
	oob := make([]byte, rightsOOB)
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
	oob := make([]byte, rightsOOB)
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
