package colo

// Every OS call of the colo transport goes through this file: memfd, seals, mmap, rings,
// epoll, SCM_RIGHTS (and gift.go: what a peer passes; ctl.go: the control socket's drain),
// SO_PEERCRED. Descriptors that goroutines wait on are wrapped with os.NewFile after being made
// non-blocking, so waits park in the Go netpoller.

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const requiredSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// newSegmentFd creates a sealable memfd of the given size. Seals are added by sealSegment once the
// header is written.
func newSegmentFd(size uint64) (int, error) {
	fd, err := unix.MemfdCreate("colo", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, os.NewSyscallError("memfd_create", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, os.NewSyscallError("ftruncate", err)
	}
	return fd, nil
}

func sealSegment(fd int) error {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, requiredSeals)
	return os.NewSyscallError("fcntl(F_ADD_SEALS)", err)
}

// checkSegmentFd verifies that fd is a tmpfs memfd carrying the required seals and returns its
// size. A hugetlbfs memfd (MFD_HUGETLB) takes the seals as well, and a fault of ours in a page
// of it its owner punched raises SIGBUS once no huge page is free, which ends a Go program: it
// is refused before it is mapped, as the Rust core refuses it (colo-sys attach_sealed).
func checkSegmentFd(fd int) (uint64, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return 0, fmt.Errorf("%w: not a memfd (%v)", errBadSegment, err)
	}
	if seals&requiredSeals != requiredSeals {
		return 0, fmt.Errorf("%w: missing seals (have %#x)", errBadSegment, seals)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		return 0, fmt.Errorf("%w: not a tmpfs memfd", errBadSegment)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("%w: fstat: %v", errBadSegment, err)
	}
	if st.Size < headerSize || st.Size > maxSegment {
		return 0, fmt.Errorf("%w: size %d", errBadSegment, st.Size)
	}
	return uint64(st.Size), nil
}

func mapSegment(fd int, size uint64) ([]byte, error) {
	if size > maxSegment {
		return nil, errBadSegment
	}
	b, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, os.NewSyscallError("mmap", err)
	}
	return b, nil
}

var one = [1]byte{1}

// ringBell rings the peer: a one-byte datagram sent on our end of the control socket, with
// MSG_DONTWAIT (never blocking) and MSG_NOSIGNAL (spec section 6). Errors are ignored: EAGAIN
// means the peer's end holds unread rings (it is readable already), EPIPE and ECONNRESET that it
// is gone (its hang-up tells).
//
// A raw system call: it never blocks, so the scheduler need not hand our P away for it, which
// saves entersyscall and exitsyscall on every wake-up.
func ringBell(fd int) {
	unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&one[0])), 1,
		unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
}

// maxRights is the most descriptors one message carries (the kernel's SCM_MAX_FD).
const maxRights = 253

// rightsOOB holds a control message of maxRights descriptors (CmsgSpace(4*maxRights) on 64-bit
// Linux, 1032 bytes; less elsewhere).
const rightsOOB = 1040

// soPassRights is SO_PASSRIGHTS (Linux 6.16).
const soPassRights = 83

// disarm makes the last close of each of fds, descriptors a peer passed us in one message,
// return at once: a socket's lingering is turned off (SO_LINGER with l_onoff 0). The last close
// of a TCP socket with lingering on and bytes its peer never takes would otherwise wait, for as
// long as the peer likes, in the thread that closes it (spec section 6, "Ringing and
// draining"). The peer may keep a reference of its own, turn lingering back on through it after
// ours is off and close it, leaving ours the last: so the references of sockets other than Unix
// ones (those do not linger) are handed to a thread that ends at once (handToEndingThread), as
// Rust's disarm_peer.
func disarm(fds ...int) {
	var sockets []int
	for _, fd := range fds {
		domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
		if err != nil {
			continue // not a socket: no linger
		}
		unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{})
		if domain != unix.AF_UNIX {
			sockets = append(sockets, fd)
		}
	}
	if len(sockets) > 0 {
		handToEndingThread(sockets)
	}
}

// handToEndingThread replaces each of fds by an eventfd once an OS thread of its own, with a
// copy of the descriptor table of its own (unshare(CLONE_FILES)), holds a reference to their
// files; that thread, never the main one, then ends (its goroutine returns locked to it), its
// table with it: a last close made by an exiting thread never lingers (the kernel gives a
// socket's close no linger time in a task that is exiting). Where no stand-in or table can be
// had, they stay as they are (disarmed).
func handToEndingThread(fds []int) {
	standIn, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return
	}
	defer unix.Close(standIn)
	ready, done := make(chan bool), make(chan struct{})
	var ending func(previous chan struct{})
	ending = func(previous chan struct{}) {
		runtime.LockOSThread() // never unlocked once unshared: the thread ends with this goroutine
		if previous != nil {
			close(previous)
		}
		if unix.Gettid() == unix.Getpid() {
			// The main thread: the runtime parks it for good, not ends it, when its locked
			// goroutine returns, and /proc/self reads its table. Held while another goroutine,
			// which cannot run on it meanwhile, locks another thread.
			next := make(chan struct{})
			go ending(next)
			<-next
			runtime.UnlockOSThread()
			return
		}
		own := unix.Unshare(unix.CLONE_FILES) == nil
		if !own {
			runtime.UnlockOSThread()
		}
		ready <- own
		if own {
			<-done // the numbers name the stand-in: this thread's references may be the last
		}
	}
	go ending(nil)
	if <-ready {
		for _, fd := range fds {
			unix.Dup3(standIn, fd, unix.O_CLOEXEC)
		}
		close(done)
	}
}

// refuseRights makes the Unix socket fd refuse descriptors from now on (SO_PASSRIGHTS 0); false
// where the kernel does not know the option (before Linux 6.16).
func refuseRights(fd int) bool {
	return unix.SetsockoptInt(fd, unix.SOL_SOCKET, soPassRights, 0) == nil
}

// passRightsKnown reports whether the kernel knows SO_PASSRIGHTS, so that refuseRights works on
// every Unix socket (asked once, of a socket pair made for it).
var passRightsKnown = sync.OnceValue(func() bool {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	return refuseRights(fds[0])
})

// closeRights closes every descriptor carried in a control-message buffer (discardFd).
func closeRights(oob []byte) {
	// Disarmed together: one ending thread for all of a message's sockets, not one each.
	fds := rightsIn(oob)
	disarm(fds...)
	for _, fd := range fds {
		discardFd(fd)
	}
}

// parseRights lists the descriptors carried in a control-message buffer, each disarmed; one not
// kept is released by discardFd.
func parseRights(oob []byte) []int {
	fds := rightsIn(oob)
	disarm(fds...)
	return fds
}

// preadFull reads len(dst) bytes of the file fd from off (again after EINTR and short reads)
// and returns how many it read before end of file or an error.
func preadFull(fd int, dst []byte, off uint64) int {
	done := 0
	for done < len(dst) {
		k, err := unix.Pread(fd, dst[done:], int64(off)+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil || k <= 0 {
			break
		}
		done += k
	}
	return done
}

func peerCred(fd int) (*unix.Ucred, error) {
	return unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
}

// affinityUnionIsOne reports whether this process and pid can together run on only one CPU.
// When this process may run on several CPUs the union has several too, and the peer is not
// asked (our own mask is re-read at most every second).
func affinityUnionIsOne(pid int) bool {
	own, n := ownAffinity()
	if n != 1 {
		return false
	}
	var b unix.CPUSet
	if unix.SchedGetaffinity(pid, &b) != nil {
		return false
	}
	c := 0
	for i := range own {
		c += popcount(uint64(own[i] | b[i]))
	}
	return c == 1
}

var affinityCache struct {
	sync.Mutex
	when time.Time
	set  unix.CPUSet
	n    int
}

func ownAffinity() (unix.CPUSet, int) {
	affinityCache.Lock()
	defer affinityCache.Unlock()
	if time.Since(affinityCache.when) > time.Second {
		var a unix.CPUSet
		if unix.SchedGetaffinity(0, &a) == nil {
			affinityCache.set, affinityCache.n = a, a.Count()
		} else {
			affinityCache.n = 0
		}
		affinityCache.when = time.Now()
	}
	return affinityCache.set, affinityCache.n
}

func popcount(x uint64) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// Shared-memory accessors. Offsets are validated against the private copy of the geometry
// before use; every access is 4- or 8-byte aligned because the layout is.

func u64at(b []byte, off uint64) *uint64 {
	_ = b[off+7]
	return (*uint64)(unsafe.Pointer(&b[off]))
}

func u32at(b []byte, off uint64) *uint32 {
	_ = b[off+3]
	return (*uint32)(unsafe.Pointer(&b[off]))
}

func loadU32(b []byte, off uint64) uint32 { return atomic.LoadUint32(u32at(b, off)) }

func putLE32(b []byte, off uint64, v uint32) { binary.LittleEndian.PutUint32(b[off:off+4], v) }
func getLE32(b []byte, off uint64) uint32    { return binary.LittleEndian.Uint32(b[off : off+4]) }

func unmap(c *Conn) {
	if c.seg != nil {
		munmapSegment(c.seg)
		c.seg = nil
	}
}

func unixGetpid() int { return unix.Getpid() }

// futexWake wakes every waiter of the shared (not private) futex at addr, a waiting word of
// the segment (spec section 6, FUTEX bit).
func futexWake(addr *uint32) {
	const futexWakeOp = 1 // FUTEX_WAKE, without FUTEX_PRIVATE_FLAG: the word is shared memory
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, uintptr(math.MaxInt32), 0, 0, 0)
}

// cpusOversubscribed reports whether more threads are runnable on this host than it has CPUs
// online, so that some wait for one (spec/WIRE.md section 9): a spin then only holds off the
// thread it waits for. The running count of /proc/loadavg is an instant sample (an open, a read
// and a close: too dear for every wait); one is taken at most every oversubscribedEvery, by the goroutine that
// asks first, and folded into a moving average over the last few samples: the host counts as
// oversubscribed while that average exceeds the CPUs by half a thread (a lone sample would
// misjudge a two-process ping-pong, its two spinners plus whatever runs at that instant). False
// when /proc cannot be read.
func cpusOversubscribed() bool {
	now := nanotime()
	last := loadavgSample.at.Load()
	if now-last < oversubscribedEvery || !loadavgSample.at.CompareAndSwap(last, now) {
		return loadavgSample.crowded.Load()
	}
	running, ok := sampleRunning()
	if !ok {
		return false
	}
	// avg += (sample - avg) / 4, in 1/256ths.
	old := loadavgSample.average.Load()
	avg := old + (int64(running)<<8-old)/4
	loadavgSample.average.Store(avg)
	crowded := avg > int64(onlineCPUs())<<8+128
	loadavgSample.crowded.Store(crowded)
	return crowded
}

// oversubscribedEvery is how often cpusOversubscribed samples /proc/loadavg (a Linux tick at
// HZ=250, the period of the Rust implementation's coarse clock).
const oversubscribedEvery = 4_000_000

// loadavgSample is shared by every connection of the process. Its words are atomic so that any
// goroutine may read them; they order no other memory (a stale answer only changes whether one
// wait spins). The CompareAndSwap of at elects the one goroutine that takes the next sample.
var loadavgSample struct {
	at      atomic.Int64
	average atomic.Int64
	crowded atomic.Bool
}

// sampleRunning reads the running count of /proc/loadavg, opening the file each time (a
// descriptor kept open could be closed under us by a program that closes all its descriptors).
func sampleRunning() (int, bool) {
	fd, err := unix.Open("/proc/loadavg", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	var buf [128]byte
	n, err := unix.Read(fd, buf[:])
	if err != nil {
		return 0, false
	}
	return runningOfLoadavg(buf[:n])
}

// onlineCPUs is the number of CPUs online (/sys/devices/system/cpu/online, "0-1,4"), not those
// this process may use: the running count is the whole host's.
var onlineCPUs = sync.OnceValue(func() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return runtime.NumCPU()
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		a, errA := strconv.Atoi(lo)
		z, errZ := strconv.Atoi(hi)
		if errA == nil && errZ == nil && z >= a {
			n += z - a + 1
		}
	}
	return max(n, 1)
})

// runningOfLoadavg is the runnable-thread count of a /proc/loadavg line
// ("0.52 0.58 0.59 3/467 1234").
func runningOfLoadavg(line []byte) (int, bool) {
	f := strings.Fields(string(line))
	if len(f) < 4 {
		return 0, false
	}
	running, _, ok := strings.Cut(f[3], "/")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(running)
	return n, err == nil
}
