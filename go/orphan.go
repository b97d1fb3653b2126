package colo

// Bytes a closed connection leaves unread by a peer of another user are kept for a bounded
// time, as TCP drops an orphaned socket's unsent bytes on a timer (spec/WIRE.md section 8,
// "Orphaned bytes"). Their pages, in a memfd the peer holds, are charged to our memory cgroup
// for as long as they exist, and the peer decides how long that is by reading them or not. So
// Close keeps such a segment mapped, and a timer looks at it every orphanLook: the pages of the
// bytes read since are given back, the segment goes once they are all read, and a peer that
// read none of them for orphanIdle, or that has held them for orphanMost, loses them: the ring
// is marked RESET and DROPPED (it reads a reset, never the zeros of a page given back) and
// every page of it goes. What is kept is still counted in the mapped budget (its lease goes with
// the mapping). At most orphanWatched kept segments keep their control socket: the rest hold no
// descriptor and go by the timers alone, so that a peer's closed connections cannot use up our
// limit of open files (an orphaned TCP socket holds no descriptor of its program's).

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

const (
	orphanIdle = 60 * time.Second  // a peer that reads none of the bytes for this long loses them
	orphanMost = 600 * time.Second // however it reads them, it loses what is left after this long
	orphanLook = 5 * time.Second   // how often a kept segment is looked at
	// orphanWatched is how many kept segments may keep their control socket: a sixteenth of
	// a limit of 1024 open files.
	orphanWatched = 64
)

// orphansWatching counts the kept segments that keep their control socket (a count: it orders
// nothing).
var orphansWatching atomic.Int32

type orphan struct {
	c           *Conn  // closed: only its segment's views (out, lay, tx.size) are used
	seg         []byte // the mapping, unmapped when the orphan goes
	tail        uint64 // peerProgress at the last look
	moved, kept time.Time
	ctl         bool // Close kept the control socket (c.ctl) for ctlHungUp
}

// keepOrphan gives back the pages of free (what Close would give back) and keeps the segment
// until its peer read the bytes left in our ring and released the messages it holds of ours, or
// lost them; ctl: Close kept the control
// socket, shut down for writing, to see the peer's hang-up on.
func (c *Conn) keepOrphan(free [][]byte, ctl bool) {
	for _, b := range free {
		releasePages(b)
	}
	if ctl && orphansWatching.Add(1) > orphanWatched {
		orphansWatching.Add(-1)
		c.ctl.Close()
		ctl = false
	}
	now := time.Now()
	o := &orphan{c: c, seg: c.seg, tail: c.peerProgress(), moved: now, kept: now, ctl: ctl}
	time.AfterFunc(orphanLook, o.look)
}

// peerProgress is the peer's ring_tail plus its free_head: either moves as it reads our bytes or
// releases our messages.
func (c *Conn) peerProgress() uint64 {
	// SYNC POINT with the peer's stores of ring_tail after its copies out (as in outgoingFree)
	// and of free_head after its reads of the slots it released (as in messagesHeld).
	return atomic.LoadUint64(c.out.tail) + atomic.LoadUint64(c.out.freeHead)
}

func (o *orphan) look() {
	c := o.c
	free := c.outgoingFree(false)
	// Read once: the decision to let the segment go and what goes with it are the same look.
	if len(free) < 2 && !c.messagesHeld() { // every byte read and message released (or broken words)
		o.done(append(free, c.poolFree(o.seg, false)...))
		return
	}
	now, t := time.Now(), c.peerProgress()
	if t != o.tail {
		o.tail, o.moved = t, now
		for _, b := range free {
			releasePages(b)
		}
	}
	if o.ctlHungUp() || now.Sub(o.moved) >= orphanIdle || now.Sub(o.kept) >= orphanMost {
		// SYNC POINT with the peer consumer's load of ring_flags after the fence that follows
		// its copy (consumer.read): stored before the pages go (MADV_REMOVE takes them out of
		// the peer's page tables and the file), so a copy that saw a page gone sees the flag.
		atomic.OrUint32(c.out.flags, flagRESET|flagDropped)
		o.done(append(c.outgoingFree(true), c.poolFree(o.seg, false)...))
		return
	}
	time.AfterFunc(orphanLook, o.look)
}

// done lets the segment go (giving back free) and closes the control socket Close kept.
func (o *orphan) done(free [][]byte) {
	if o.ctl {
		o.c.ctl.Close()
		orphansWatching.Add(-1)
	}
	unmapAfter(o.seg, free...)
}

// ctlHungUp reports whether the peer hung up the control socket Close kept (shut down for
// writing: only the peer's own close or shutdown shows). Then nobody reads the bytes; they go
// with DROPPED set, for any holder of the peer's end that is left.
func (o *orphan) ctlHungUp() bool {
	if !o.ctl {
		return false
	}
	fds := []unix.PollFd{{Fd: int32(o.c.ctlFd), Events: unix.POLLRDHUP}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
}
