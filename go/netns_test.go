package colo

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestNetnsRules(t *testing.T) {
	r := parseNetnsRules("10.0.2.0/24=/a, 10.96.0.10:80 ,bad,[fd00::1]:443=/c", "/b")
	if len(r) != 3 {
		t.Fatalf("rules %+v", r)
	}
	if !r[0].net.Contains(netip.MustParseAddr("10.0.2.7")) || r[0].net.Contains(netip.MustParseAddr("10.0.3.7")) || r[0].port != -1 {
		t.Fatalf("network entry %+v", r[0])
	}
	if r[1].port != 80 || r[1].dir != "/b" || r[2].port != 443 || r[2].dir != "/c" {
		t.Fatalf("address:port entries %+v", r[1:])
	}
	if len(parseNetnsRules("10.0.0.1", "")) != 0 {
		t.Fatal("an entry without a directory was kept")
	}
}

func TestNetnsNamesAndLiveness(t *testing.T) {
	for _, bad := range []string{"", ".", "..", "../x", "a/b", "/etc", "a\x00b", string(make([]byte, 65))} {
		if validRendezvousName([]byte(bad)) {
			t.Fatalf("%q accepted", bad)
		}
	}
	if !validRendezvousName([]byte("colo-12-6379")) {
		t.Fatal("a rendezvous name refused")
	}
	dir := t.TempDir()
	live := filepath.Join(dir, "colo-12-6379.live")
	if err := os.WriteFile(live, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if liveListener(dir, 6379) {
		t.Fatal("an unlocked .live file counted as a live listener")
	}
	fd, err := unix.Open(live, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := lockLive(fd); err != nil {
		t.Fatal(err)
	}
	if !liveListener(dir, 6379) || !liveListener(dir, -1) || liveListener(dir, 6380) {
		t.Fatal("a locked .live file: wrong liveness by port")
	}
}

// An attacker who can only read the directory (a read-only mount, or nobody on a file of mode
// 0644) takes every lock a read-only descriptor allows on a dead server's .live: clients must
// still see no live listener, or they would propose to a plain successor on that port.
func TestNetnsReadersLocksAreNotLiveness(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "colo-7-6379.live")
	if err := os.WriteFile(live, nil, 0o644); err != nil { // a dead server's file
		t.Fatal(err)
	}
	var ro [3]int
	for i := range ro {
		fd, err := unix.Open(live, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		ro[i] = fd
	}
	if err := unix.Flock(ro[0], unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	rd := unix.Flock_t{Type: unix.F_RDLCK}
	if err := unix.FcntlFlock(uintptr(ro[1]), unix.F_OFD_SETLK, &rd); err != nil {
		t.Fatal(err)
	}
	if err := unix.FcntlFlock(uintptr(ro[2]), unix.F_SETLK, &rd); err != nil {
		t.Fatal(err)
	}
	if err := lockLive(ro[2]); err != unix.EBADF {
		t.Fatalf("a write lock on a read-only descriptor: %v, want EBADF", err)
	}
	if liveListener(dir, 6379) || liveListener(dir, -1) {
		t.Fatal("a reader's lock counted as a live server")
	}
}

func TestNetnsVectors(t *testing.T) {
	var vs []map[string]any
	loadVectors(t, "netns.json", &vs)
	unhex := func(v map[string]any, k string) []byte {
		b, err := hex.DecodeString(v[k].(string))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, v := range vs {
		switch v["name"] {
		case "proposal":
			if got := netnsProposal(unhex(v, "boot"), unhex(v, "client_nonce")); !bytes.Equal(got, unhex(v, "hex")) {
				t.Fatalf("proposal %x", got)
			}
		case "accept":
			a := unhex(v, "hex")
			if len(a) != netnsAnswerLen || !bytes.Equal(a[:8], netnsMagic) || a[8] != netnsAccept || string(a[48:48+a[11]]) != v["rendezvous"] {
				t.Fatalf("accept %x", a)
			}
		case "hello_carrier_netns":
			if got := (hsMsg{Type: MsgHello, Version: Version, Arg: ModeCarrier, Flags: flagNetns}).encode(); !bytes.Equal(got, unhex(v, "hex")) || v["proof_offset"].(float64) != hProof {
				t.Fatalf("hello %x", got)
			}
		}
	}
}

// Another tenant fills a rendezvous's backlog with connections the server has not accepted: a
// client's connect gives up after its wait instead of waiting for the server's next accept
// (watchdog: the connect runs in a goroutine the test waits 20 s for).
func TestNetnsConnectToFullBacklogTimesOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "colo-3-80")
	l, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(l)
	if err := unix.Bind(l, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(l, 1); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(s)
		if err := unix.Connect(s, &unix.SockaddrUnix{Name: path}); err == unix.EAGAIN {
			break
		} else if err != nil || i > 100 {
			t.Fatalf("flood: %v after %d", err, i)
		}
	}
	done := make(chan error, 1)
	go func() {
		fd, err := connectRendezvousPath(path, 100*time.Millisecond)
		if err == nil {
			unix.Close(fd)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != errRendezvousFull {
			t.Fatalf("connect to a full backlog: %v, want %v", err, errRendezvousFull)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("connect to a full backlog did not time out")
	}
	a, _, err := unix.Accept(l) // room again: the next connect goes through
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(a)
	fd, err := connectRendezvousPath(path, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if tv, err := unix.GetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO); err != nil || tv.Sec != 0 || tv.Usec != 0 {
		t.Fatalf("the connect's timeout stays on the socket: %v %v", tv, err)
	}
}

// The rendezvous socket's mode is set on that socket only: never through a symbolic link or on a
// hard link of another socket that a writer of the directory put under its name.
func TestNetnsModeOnTheBoundSocketOnly(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "colo-1-1")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	if err := openToAll(sock); err != nil {
		t.Fatal(err)
	}
	mode := func(p string) os.FileMode {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return st.Mode().Perm()
	}
	if m := mode(sock); m != 0o666 {
		t.Fatalf("socket mode %o", m)
	}
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(sock, filepath.Join(dir, "hard")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"link", "secret", "hard"} {
		if openToAll(filepath.Join(dir, name)) == nil {
			t.Errorf("%s: mode set", name)
		}
	}
	if m := mode(secret); m != 0o600 {
		t.Fatalf("secret's mode became %o", m)
	}
}
