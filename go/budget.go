package colo

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Bounds on the peers' segments this process maps (docs/SAFETY.md item 14), as in the Rust
// core's colo::budget: a peer chooses its segment's size (up to maxSegment) and may hand the
// same sparse memfd over again and again, each time costing address space and page tables. So
// every segment received from a peer is mapped under a lease on two budgets: the bytes of peer
// segments mapped in total (COLO_MAX_MAPPED_MB, default 256 GiB or half of RLIMIT_AS if that is
// less) and the share one peer uid may
// hold (COLO_MAX_MAPPED_PER_UID_MB, default a quarter of the total). A segment that does not
// fit is not kept: the listener answers REJECT(NO_RESOURCES) (the client uses TCP) and keeps
// serving. The lease is given back when the mapping is unmapped (munmapSegment).

// maxSegment is the largest segment a peer may hand us (256 MiB, as the Rust core's
// MAX_SEGMENT): every geometry colo's clients create, and rings of up to 64 MiB per direction.
const maxSegment = 1 << 28

const defaultMappedMB = 256 * 1024

type budget struct {
	total, perUID, used uint64
	byUID               map[uint32]uint64
}

// take takes n bytes for uid, or returns an error naming the limit it would exceed.
func (b *budget) take(uid uint32, n uint64) error {
	mine := b.byUID[uid]
	if mine+n < mine || mine+n > b.perUID {
		return fmt.Errorf("segment of %d KiB: COLO_MAX_MAPPED_PER_UID_MB=%d reached for uid %d (%d MiB mapped)",
			n>>10, b.perUID>>20, uid, mine>>20)
	}
	if b.used+n < b.used || b.used+n > b.total {
		return fmt.Errorf("segment of %d KiB: COLO_MAX_MAPPED_MB=%d reached (%d MiB of peer segments mapped)",
			n>>10, b.total>>20, b.used>>20)
	}
	b.used += n
	b.byUID[uid] = mine + n
	return nil
}

func (b *budget) giveBack(uid uint32, n uint64) {
	b.used -= min(n, b.used)
	if m := b.byUID[uid]; m > n {
		b.byUID[uid] = m - n
	} else {
		delete(b.byUID, uid)
	}
}

func newBudget(total, perUID uint64) *budget {
	return &budget{total: total, perUID: min(perUID, total), byUID: map[uint32]uint64{}}
}

func envMB(name string) uint64 {
	v, err := strconv.ParseUint(strings.TrimSpace(os.Getenv(name)), 10, 64)
	if err != nil || v == 0 {
		return 0
	}
	return v
}

type lease struct {
	uid uint32
	n   uint64
}

var mapped struct {
	sync.Mutex
	b      *budget
	leases map[uintptr]lease // by the mapping's first byte
}

func mappedBudget() *budget {
	if mapped.b == nil {
		total := envMB("COLO_MAX_MAPPED_MB")
		if total == 0 {
			total = defaultMappedMB
			// Half the address-space limit (ulimit -v), if that is less: the heap and the
			// goroutine stacks are never crowded out by peers' segments.
			var rl unix.Rlimit
			if unix.Getrlimit(unix.RLIMIT_AS, &rl) == nil && rl.Cur != unix.RLIM_INFINITY {
				total = max(min(total, rl.Cur/2>>20), 1)
			}
		}
		per := envMB("COLO_MAX_MAPPED_PER_UID_MB")
		if per == 0 {
			per = total / 4
		}
		mapped.b = newBudget(total<<20, per<<20)
		mapped.leases = map[uintptr]lease{}
	}
	return mapped.b
}

// errBudget marks a segment refused by the budgets (the error's text names the limit).
var errBudget = errors.New("colo: mapped-bytes budget")

// mapPeerSegment maps a peer's segment of size bytes (checked by checkSegmentFd) under a lease
// for uid: the budgets are asked first, so a segment beyond them is never mapped. The lease is
// given back by munmapSegment.
func mapPeerSegment(fd int, size uint64, uid uint32) ([]byte, error) {
	mapped.Lock()
	err := mappedBudget().take(uid, size)
	mapped.Unlock()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBudget, err)
	}
	seg, err := mapSegment(fd, size)
	mapped.Lock()
	if err != nil {
		mappedBudget().giveBack(uid, size)
	} else {
		mapped.leases[uintptr(unsafe.Pointer(&seg[0]))] = lease{uid, size}
	}
	mapped.Unlock()
	return seg, err
}

// munmapSegment unmaps a segment mapping and gives back its lease, if it has one.
func munmapSegment(seg []byte) {
	if len(seg) == 0 {
		return
	}
	at := uintptr(unsafe.Pointer(&seg[0]))
	mapped.Lock()
	if l, ok := mapped.leases[at]; ok {
		delete(mapped.leases, at)
		mappedBudget().giveBack(l.uid, l.n)
	}
	mapped.Unlock()
	unix.Munmap(seg)
}
