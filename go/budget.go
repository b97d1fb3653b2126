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
// same sparse memfd over again and again, each time costing address space, a mapping and page
// tables. So every segment received from a peer is mapped under a lease on three budgets: the
// bytes of peer segments mapped in total (COLO_MAX_MAPPED_MB, default 256 GiB or half of
// RLIMIT_AS if that is less), the share one peer uid may hold (COLO_MAX_MAPPED_PER_UID_MB,
// default a quarter of the total), and the number of peer segments mapped (COLO_MAX_SEGMENTS,
// default a quarter of vm.max_map_count: each is one of the mappings the kernel allows a
// process, beyond which the runtime's own mmap fails and Go aborts), of which one peer uid may
// hold a quarter (else one user's smallest segments would take them all, and every other
// user's connections would go plain TCP). A segment that does not
// fit is not kept: the listener answers REJECT(NO_RESOURCES) (the client uses TCP) and keeps
// serving. The lease is given back when the mapping is unmapped (munmapSegment).

// maxSegment is the largest segment a peer may hand us (256 MiB, as the Rust core's
// MAX_SEGMENT): every geometry colo's clients create, and rings of up to 64 MiB per direction.
const maxSegment = 1 << 28

const defaultMappedMB = 256 * 1024

// defaultMaxMapCount is the kernel's default vm.max_map_count, assumed when it cannot be read.
const defaultMaxMapCount = 65530

type budget struct {
	total, perUID, used   uint64
	maxSegments, segments uint64
	byUID                 map[uint32]uidLease // bytes and segments by uid
}

type uidLease struct{ n, segments uint64 }

// take takes one segment of n bytes for uid, or returns an error naming the limit it would
// exceed.
func (b *budget) take(uid uint32, n uint64) error {
	if b.segments >= b.maxSegments {
		return fmt.Errorf("segment of %d KiB: COLO_MAX_SEGMENTS=%d reached (%d peer segments mapped)",
			n>>10, b.maxSegments, b.segments)
	}
	my := b.byUID[uid]
	if per := max(b.maxSegments/4, 1); my.segments >= per {
		return fmt.Errorf("segment of %d KiB: COLO_MAX_SEGMENTS=%d reached for uid %d (its quarter, %d peer segments)",
			n>>10, b.maxSegments, uid, per)
	}
	mine := my.n
	if mine+n < mine || mine+n > b.perUID {
		return fmt.Errorf("segment of %d KiB: COLO_MAX_MAPPED_PER_UID_MB=%d reached for uid %d (%d MiB mapped)",
			n>>10, b.perUID>>20, uid, mine>>20)
	}
	if b.used+n < b.used || b.used+n > b.total {
		return fmt.Errorf("segment of %d KiB: COLO_MAX_MAPPED_MB=%d reached (%d MiB of peer segments mapped)",
			n>>10, b.total>>20, b.used>>20)
	}
	b.used += n
	b.segments++
	b.byUID[uid] = uidLease{mine + n, my.segments + 1}
	return nil
}

// giveBack gives back the segment of n bytes that take gave uid.
func (b *budget) giveBack(uid uint32, n uint64) {
	b.used -= min(n, b.used)
	b.segments -= min(1, b.segments)
	if m := b.byUID[uid]; m.segments > 1 {
		b.byUID[uid] = uidLease{m.n - min(n, m.n), m.segments - 1}
	} else {
		delete(b.byUID, uid)
	}
}

func newBudget(total, perUID, maxSegments uint64) *budget {
	return &budget{total: total, perUID: min(perUID, total), maxSegments: maxSegments, byUID: map[uint32]uidLease{}}
}

// maxSegmentsOf is the number of peer segments mapped at once: env (COLO_MAX_SEGMENTS) if not
// 0, else a quarter of the mappings the kernel allows a process (maxMapCount, or its default if
// 0: unknown), leaving the rest to the program itself.
func maxSegmentsOf(env, maxMapCount uint64) uint64 {
	if env != 0 {
		return env
	}
	if maxMapCount == 0 {
		maxMapCount = defaultMaxMapCount
	}
	return max(maxMapCount/4, 1)
}

// maxMapCount is /proc/sys/vm/max_map_count, or 0 if it cannot be read.
func maxMapCount() uint64 {
	b, err := os.ReadFile("/proc/sys/vm/max_map_count")
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return v
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
		mapped.b = newBudget(total<<20, per<<20, maxSegmentsOf(envMB("COLO_MAX_SEGMENTS"), maxMapCount()))
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
