package colo

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestBudgetPerUIDThenTotal(t *testing.T) {
	const mib = 1 << 20
	b := newBudget(10*mib, 4*mib, 100)
	if err := b.take(1, 3*mib); err != nil {
		t.Fatal(err)
	}
	if err := b.take(1, 2*mib); err == nil || !strings.Contains(err.Error(), "COLO_MAX_MAPPED_PER_UID_MB=4") {
		t.Fatalf("uid 1 beyond its share: %v", err)
	}
	if err := b.take(1, mib); err != nil {
		t.Fatalf("exactly the share: %v", err)
	}
	if err := b.take(2, 4*mib); err != nil {
		t.Fatal(err)
	}
	if err := b.take(3, 3*mib); err == nil || !strings.Contains(err.Error(), "COLO_MAX_MAPPED_MB=10") {
		t.Fatalf("beyond the total: %v", err)
	}
	if err := b.take(3, 2*mib); err != nil {
		t.Fatal(err)
	}
	if b.used != 10*mib || b.byUID[1].n != 4*mib || b.byUID[3].n != 2*mib {
		t.Fatalf("used %d, by uid %v", b.used, b.byUID)
	}
	b.giveBack(1, 3*mib)
	b.giveBack(1, mib)
	if _, ok := b.byUID[1]; ok || b.used != 6*mib {
		t.Fatalf("after give back: used %d, by uid %v", b.used, b.byUID)
	}
	if err := b.take(4, ^uint64(0)); err == nil {
		t.Fatal("an overflowing request was taken")
	}
}

func TestBudgetSegmentsCountedWhateverTheirSize(t *testing.T) {
	b := newBudget(^uint64(0), ^uint64(0), 3)
	for uid := uint32(1); uid <= 3; uid++ {
		if err := b.take(uid, 4096); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.take(4, 4096); err == nil || !strings.Contains(err.Error(), "COLO_MAX_SEGMENTS=3 reached (3 peer segments mapped)") {
		t.Fatalf("a fourth segment, of any uid: %v", err)
	}
	b.giveBack(2, 4096)
	if err := b.take(4, 4096); err != nil {
		t.Fatalf("one given back makes room for one: %v", err)
	}
	if err := b.take(1, 1); err == nil {
		t.Fatal("a fourth segment was taken")
	}
}

func TestBudgetOneUIDHoldsAQuarterOfTheSegments(t *testing.T) {
	b := newBudget(^uint64(0), ^uint64(0), 8)
	for range 2 {
		if err := b.take(1, 4096); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.take(1, 4096); err == nil || !strings.Contains(err.Error(), "reached for uid 1 (its quarter, 2 peer segments)") {
		t.Fatalf("a third of uid 1's, of 8: %v", err)
	}
	if err := b.take(2, 4096); err != nil {
		t.Fatalf("another uid's: %v", err)
	}
	b.giveBack(1, 4096)
	if err := b.take(1, 4096); err != nil {
		t.Fatalf("one given back makes room for one: %v", err)
	}
}

func TestMaxSegmentsIsAQuarterOfMaxMapCountUnlessSet(t *testing.T) {
	for _, c := range []struct{ env, count, want uint64 }{
		{0, 65530, 16382},
		{0, 1 << 20, 1 << 18},
		{0, 0, 16382}, // unreadable: the kernel's default
		{0, 2, 1},     // never zero
		{50, 65530, 50},
	} {
		if got := maxSegmentsOf(c.env, c.count); got != c.want {
			t.Errorf("maxSegmentsOf(%d, %d) = %d, want %d", c.env, c.count, got, c.want)
		}
	}
}

func TestBudgetLeaseReleasedOnUnmap(t *testing.T) {
	fd, err := newSegmentFd(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	const uid = ^uint32(0) - 5 // no real peer has it
	mapped.Lock()
	before := mappedBudget().byUID[uid].n
	mapped.Unlock()
	seg, err := mapPeerSegment(fd, 1<<20, uid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mapPeerSegment(fd, 1<<62, uid); !errors.Is(err, errBudget) || !strings.Contains(err.Error(), "COLO_MAX_MAPPED") {
		t.Fatalf("a segment beyond the budgets: %v", err)
	}
	mapped.Lock()
	during := mappedBudget().byUID[uid].n
	mapped.Unlock()
	munmapSegment(seg)
	mapped.Lock()
	after := mappedBudget().byUID[uid].n
	mapped.Unlock()
	if during != before+1<<20 || after != before {
		t.Fatalf("uid's bytes: %d before, %d leased, %d after unmap", before, during, after)
	}
}

// Silent rendezvous clients beyond a uid's share get REJECT(NO_RESOURCES), and never hold up
// plain TCP accepts.
func TestHalfOpenBounded(t *testing.T) {
	watchdog(t, 60*time.Second)
	l := listen(t)
	var held []int
	defer func() {
		for _, fd := range held {
			unix.Close(fd)
		}
	}()
	// More than the TCP accept queue's tokens too: they must not be what silent clients use up.
	for i := 0; i < maxUnaccepted+50; i++ {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, fd)
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + l.name}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond) // the listener works through its backlog
	rejected := 0
	for _, fd := range held {
		var buf [64]byte
		n, _, err := unix.Recvfrom(fd, buf[:], unix.MSG_DONTWAIT)
		if err != nil || n != msgSize {
			continue // held (no answer yet), or closed
		}
		if m, derr := decodeMsg(buf[:n]); derr == nil && m.Type == MsgReject && m.Arg == RejectNoResources {
			rejected++
		}
	}
	if want := len(held) - maxHalfOpenPerUID; rejected < want {
		t.Fatalf("%d of %d silent clients were refused; want %d beyond the share of %d", rejected, len(held), want, maxHalfOpenPerUID)
	}
	// A plain TCP client is accepted at once all the same.
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	// From an even port, which no CARRIER client uses: nothing to wait for.
	var tc net.Conn
	var err error
	for port := 40000 + 2*(os.Getpid()%1000); tc == nil && port < 60000; port += 2 {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}}
		tc, err = d.Dial("tcp", l.Addr().String())
	}
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	start := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a TCP accept waited behind silent rendezvous clients")
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Fatalf("a TCP accept from an even port took %v behind silent rendezvous clients", d)
	}
}

// Under a low limit of open files a listener holds an eighth of it in unanswered rendezvous
// connections (each holds one or two descriptors), at least 16.
func TestHalfOpenBoundIsAnEighthOfALowLimit(t *testing.T) {
	for _, c := range []struct {
		soft uint64
		want int
	}{{1024, 128}, {20000, maxHalfOpen}, {0, maxHalfOpen}, {20, 16}} {
		if got := halfOpenBound(c.soft); got != c.want {
			t.Errorf("halfOpenBound(%d) = %d, want %d", c.soft, got, c.want)
		}
	}
}
