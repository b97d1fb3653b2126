package colo

import (
	"sync"

	"golang.org/x/sys/unix"
)

// segRes is a fresh segment ready to be offered: a sealed memfd of the geometry's size (sent with
// the HELLO, then handed to the connection: Conn.readThrough) and its mapping. It is shared with nobody until a HELLO carries it.
type segRes struct {
	lay   layout
	memfd int
	seg   []byte
}

func newSegRes(g Geometry) (*segRes, error) {
	r := &segRes{lay: g.layout(), memfd: -1}
	var err error
	if r.memfd, err = newSegmentFd(r.lay.segmentSize); err != nil {
		return nil, err
	}
	if err = sealSegment(r.memfd); err != nil {
		r.close()
		return nil, err
	}
	if r.seg, err = mapSegment(r.memfd, r.lay.segmentSize); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *segRes) close() {
	if r.seg != nil {
		unix.Munmap(r.seg)
		r.seg = nil
	}
	if r.memfd >= 0 {
		unix.Close(r.memfd)
	}
	r.memfd = -1
}

// A few segments per geometry are created ahead of time by a background goroutine, so that a
// dial does not wait for memfd_create, ftruncate, and mmap (and the HELLO follows
// the rendezvous connect at once). A segment is used at most once: one that was offered to a
// server is never pooled again.
const segPoolSize = 2

var segPool struct {
	sync.Mutex
	free    map[Geometry][]*segRes
	filling map[Geometry]bool
}

func takeSeg(g Geometry) (*segRes, error) {
	segPool.Lock()
	if segPool.free == nil {
		segPool.free = map[Geometry][]*segRes{}
		segPool.filling = map[Geometry]bool{}
	}
	var r *segRes
	if l := segPool.free[g]; len(l) > 0 {
		r = l[len(l)-1]
		segPool.free[g] = l[:len(l)-1]
	}
	if !segPool.filling[g] && len(segPool.free) <= 4 {
		segPool.filling[g] = true
		go fillSegPool(g)
	}
	segPool.Unlock()
	if r != nil {
		return r, nil
	}
	return newSegRes(g)
}

func fillSegPool(g Geometry) {
	for {
		segPool.Lock()
		if len(segPool.free[g]) >= segPoolSize {
			segPool.filling[g] = false
			segPool.Unlock()
			return
		}
		segPool.Unlock()
		r, err := newSegRes(g)
		segPool.Lock()
		if err != nil {
			segPool.filling[g] = false
			segPool.Unlock()
			return
		}
		segPool.free[g] = append(segPool.free[g], r)
		segPool.Unlock()
	}
}

// putSeg returns a segment that was never offered.
func putSeg(r *segRes) {
	segPool.Lock()
	if segPool.free != nil && len(segPool.free[r.lay.Geometry]) < segPoolSize {
		segPool.free[r.lay.Geometry] = append(segPool.free[r.lay.Geometry], r)
		r = nil
	}
	segPool.Unlock()
	if r != nil {
		r.close()
	}
}

// drainSegPool closes every pooled segment (tests count descriptors).
func drainSegPool() {
	segPool.Lock()
	var all []*segRes
	for g, l := range segPool.free {
		all = append(all, l...)
		delete(segPool.free, g)
	}
	segPool.Unlock()
	for _, r := range all {
		r.close()
	}
}
