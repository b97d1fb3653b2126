package colo

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

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
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if !liveListener(dir, 6379) || !liveListener(dir, -1) || liveListener(dir, 6380) {
		t.Fatal("a locked .live file: wrong liveness by port")
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
