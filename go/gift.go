package colo

import (
	"math"
	"sync"

	"golang.org/x/sys/unix"
)

// Descriptors a peer passes us (as rust/colo-sys/src/gift.rs). disarm turns a socket's lingering
// off, but a Unix socket's last close releases what its queue holds, in the closing thread,
// undisarmed: one may be a lingering TCP socket whose close waits as long as its maker likes
// (here: an OS thread the runtime replaces, up to its limit of threads). So a Unix socket a peer
// passed us is shut down (nothing can be queued on it, or connect to it, from then on, whoever
// holds it) and emptied before its close, each descriptor in its queue discarded the same way
// (discardFd). A socket other than a Unix one is left to a thread that ends at once (disarm):
// its sender may turn lingering back on after our disarm. We keep no socket a peer passed (a HELLO's one descriptor is a memfd), and our own
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
		closePassed(fd)
		return
	}
	if rest := emptyAll([]int{fd}, inlineSockets, inlineRights); len(rest) > 0 {
		go emptyAll(rest, math.MaxInt, math.MaxInt)
	}
}

// closePassed closes a descriptor a peer passed us that is not a Unix socket. Every close of a
// file calls its file system's flush, and a FUSE file's waits for its FUSE server's answer:
// any user may mount one (in a user namespace of its own) and pass us a file of it, whose
// close would then hold the goroutine that makes it (the rendezvous loop refusing a HELLO) for
// as long as that user likes. So only a file of the kernel's own in-memory file systems (a
// memfd, a pipe, a socket, an eventfd) is closed here; any other is closed by a closer
// goroutine (slowClosers), at most maxSlowClosers at once, the rest queued for them.
func closePassed(fd int) {
	var fs unix.Statfs_t
	if unix.Fstatfs(fd, &fs) == nil {
		switch fs.Type {
		case unix.TMPFS_MAGIC, unix.PIPEFS_MAGIC, unix.SOCKFS_MAGIC, unix.ANON_INODE_FS_MAGIC:
			unix.Close(fd)
			return
		}
	}
	slowClosers.Lock()
	defer slowClosers.Unlock()
	if slowClosers.running >= maxSlowClosers {
		slowClosers.queue = append(slowClosers.queue, fd)
		return
	}
	slowClosers.running++
	go closeQueued(fd)
}

// maxSlowClosers bounds the goroutines closing descriptors whose close may wait (closePassed):
// each one waiting holds an OS thread.
const maxSlowClosers = 64

// slowClosers is the queue of descriptors closePassed left to closer goroutines, and how many
// of those run.
var slowClosers struct {
	sync.Mutex
	queue   []int
	running int
}

// closeQueued closes fd, then the queued descriptors one by one until none is left.
func closeQueued(fd int) {
	for {
		unix.Close(fd)
		slowClosers.Lock()
		if len(slowClosers.queue) == 0 {
			slowClosers.running--
			slowClosers.Unlock()
			return
		}
		fd = slowClosers.queue[0]
		slowClosers.queue = slowClosers.queue[1:]
		slowClosers.Unlock()
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
	marked := markMessages(u)
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
	oob := make([]byte, markedOOB)
	for taken < max {
		n, oobn, _, _, err := unix.Recvmsg(u, b[:], oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		if err != nil {
			return taken, true
		}
		got := rightsIn(oob[:oobn])
		disarm(got...)
		for _, fd := range got {
			if isUnixSocket(fd) {
				*work = append(*work, fd)
			} else {
				closePassed(fd)
			}
		}
		taken += len(got)
		// Shut down, an empty queue reads as its end; a zero-length datagram does too, but
		// brings credentials (markMessages).
		if n == 0 && len(got) == 0 && !(marked && credsIn(oob[:oobn])) {
			return taken, true
		}
	}
	return taken, false
}

// drainAll receives what fd holds (at most 1024 receives), discarding the descriptors.
func drainAll(fd int) {
	marked := markMessages(fd)
	var b [256]byte
	oob := make([]byte, markedOOB)
	for i := 0; i < 1024; i++ {
		n, oobn, _, _, err := unix.Recvmsg(fd, b[:], oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		if err != nil {
			return
		}
		got := rightsIn(oob[:oobn])
		for _, g := range got {
			discardFd(g)
		}
		if n == 0 && len(got) == 0 && !(marked && credsIn(oob[:oobn])) {
			return
		}
	}
}

// markedOOB is room for every descriptor one message carries and for credentials.
var markedOOB = rightsOOB + unix.CmsgSpace(unix.SizeofUcred)

// markMessages turns SO_PASSCRED on for the datagram (or seqpacket) socket fd, so that every
// datagram received from it, a zero-length one too, carries credentials and its end (0 bytes
// from a socket shut down or hung up) carries none: recv alone cannot tell them apart. False for
// a stream (which queues nothing for a zero-length send, and whose end carries credentials too)
// or where it failed. Meant for sockets about to be closed: a later receive expecting no
// credentials would find them truncated.
func markMessages(fd int) bool {
	if t, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t == unix.SOCK_STREAM {
		return false
	}
	return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PASSCRED, 1) == nil
}

// credsIn reports whether a control-message buffer carries credentials.
func credsIn(oob []byte) bool {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return false
	}
	for i := range msgs {
		if msgs[i].Header.Level == unix.SOL_SOCKET && msgs[i].Header.Type == unix.SCM_CREDENTIALS {
			return true
		}
	}
	return false
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

// takeBehind takes what a client queued on its rendezvous connection behind its HELLO, without
// waiting, discarding their descriptors; it returns how many it took (a hang-up is not one; a
// zero-length datagram is: markMessages tells them apart while this runs). After 64 the socket
// is shut down both ways: what is queued then is all it will ever hold, so a client that keeps
// sending cannot keep us here, and descriptors behind any number of datagrams are still taken
// here, never left for the close (which would release them in this thread).
func takeBehind(fd int) int {
	marked := markMessages(fd)
	var b [64]byte
	oob := make([]byte, markedOOB)
	taken := 0
	for ; ; taken++ {
		if taken == 64 {
			unix.Shutdown(fd, unix.SHUT_RDWR)
		}
		n, oobn, _, _, err := unix.Recvmsg(fd, b[:], oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		if err != nil || (n == 0 && oobn == 0) {
			break
		}
		if n == 0 && len(rightsIn(oob[:oobn])) == 0 && !(marked && credsIn(oob[:oobn])) {
			break
		}
		closeRights(oob[:oobn])
	}
	if marked {
		// Later receives (the doorbell's drains) expect no credentials.
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PASSCRED, 0)
	}
	return taken
}
