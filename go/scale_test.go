package colo

import (
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"
)

// concurrentDials dials n connections to a listener of this process at once (one goroutine
// each) and accepts them; it returns how many are on shared memory on the client and on the
// server side, and the descriptors the 2n ends added together.
func concurrentDials(t *testing.T, n int) (int, int, int) {
	t.Helper()
	l, err := ListenColo("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// One connection first: what the process sets up once is not per connection. It is
	// dialed again until its WELCOME came in time and made the listener known: a dial whose
	// answer came late goes on pending, read through its memfd (a descriptor more), and so
	// would every concurrent dial below whose answer a loaded host delays past firstAnswerWait.
	name := rendezvousName(netip.MustParseAddrPort(l.Addr().String()))
	var warm, wa *Conn
	for try := 0; ; try++ {
		if warm, err = Dial("tcp", l.Addr().String()); err != nil {
			t.Fatal(err)
		}
		if wa, err = l.AcceptColo(); err != nil {
			t.Fatal(err)
		}
		if _, known := welcomed.Load(name); known || try == 50 {
			break
		}
		warm.Close()
		wa.Close()
	}
	defer warm.Close()
	defer wa.Close()
	time.Sleep(100 * time.Millisecond)
	before := openFdCount(t)
	accepted := make(chan *Conn, n)
	go func() {
		for i := 0; i < n; i++ {
			c, err := l.AcceptColo()
			if err != nil {
				t.Error(err)
				close(accepted)
				return
			}
			accepted <- c
		}
		close(accepted)
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var clients []*Conn
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c, err := Dial("tcp", l.Addr().String())
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			clients = append(clients, c)
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	var servers []*Conn
	for c := range accepted {
		servers = append(servers, c)
	}
	fds := openFdCount(t) - before
	count := func(cs []*Conn) int {
		k := 0
		for _, c := range cs {
			if c.Transport() == TransportColo {
				k++
			}
		}
		return k
	}
	cc, sc := count(clients), count(servers)
	for _, c := range clients {
		c.Close()
	}
	for _, c := range servers {
		c.Close()
	}
	return cc, sc, fds
}

func openFdCount(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// Every one of many concurrent dials is on shared memory, and each end holds 1 descriptor
// (DIRECT: the control socket, which is also the doorbell; the segment's memfd is closed once
// mapped).
func TestConcurrentDialsAllOnSharedMemory(t *testing.T) {
	watchdog(t, 120*time.Second)
	for _, n := range []int{16, 64, 1000} {
		cc, sc, fds := concurrentDials(t, n)
		t.Logf("%d concurrent dials: client %d on shared memory, server %d; %d descriptors for both ends", n, cc, sc, fds)
		if cc != n || sc != n {
			t.Errorf("%d concurrent dials: client %d, server %d on shared memory", n, cc, sc)
		}
		if fds > 2*n {
			t.Errorf("%d concurrent dials: %d descriptors for %d connections (both ends)", n, fds, n)
		}
	}
}

// DIRECT connections answered WELCOME and waiting for Accept are not half-open: more of them than
// one uid's half-open share (maxHalfOpenPerUID) are all delivered. A client dials pending (its
// listener welcomed it before), so a REJECT(NO_RESOURCES) after its dial returned would lose the
// connection: its Accept would never come.
func TestUnacceptedDirectBeyondHalfOpenShare(t *testing.T) {
	watchdog(t, 60*time.Second)
	l, err := ListenColo("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	n := maxHalfOpenPerUID + 16
	var clients []*Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatalf("dial %d: write: %v", i, err)
		}
	}
	got := map[byte]int{}
	for i := 0; i < n; i++ {
		s, err := l.AcceptColo()
		if err != nil {
			t.Fatal(err)
		}
		var b [1]byte
		if _, err := s.Read(b[:]); err != nil {
			t.Fatalf("accept %d: read: %v", i, err)
		}
		if s.Transport() != TransportColo {
			t.Errorf("accept %d: transport %v", i, s.Transport())
		}
		got[b[0]]++
		s.Close()
	}
	want := map[byte]int{}
	for i := 0; i < n; i++ {
		want[byte(i)]++
	}
	for b, k := range want {
		if got[b] != k {
			t.Errorf("byte %d: %d connections, want %d", b, got[b], k)
		}
	}
}
