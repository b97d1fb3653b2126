package colo

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func loadVectors(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "spec", "vectors", name))
	if err != nil {
		t.Fatalf("reading vectors: %v", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func TestVectorsHandshake(t *testing.T) {
	var vs []struct {
		Name               string
		Hex                string
		Valid              bool
		Type, Version, Arg uint8
		Flags, Ticket      uint32
	}
	loadVectors(t, "handshake.json", &vs)
	if len(vs) == 0 {
		t.Fatal("no vectors")
	}
	for _, v := range vs {
		b, _ := hex.DecodeString(v.Hex)
		m, err := decodeMsg(b)
		if (err == nil) != v.Valid {
			t.Errorf("%s: valid=%v, got err %v", v.Name, v.Valid, err)
			continue
		}
		if !v.Valid {
			continue
		}
		if m.Type != v.Type || m.Version != v.Version || m.Arg != v.Arg || m.Ticket != v.Ticket ||
			(v.Flags != 0 && m.Flags != v.Flags) {
			t.Errorf("%s: decoded %+v", v.Name, m)
		}
		if m.recycle() != (v.Flags&flagRecycle != 0) {
			t.Errorf("%s: recycle() = %v", v.Name, m.recycle())
		}
		if m.Flags == v.Flags { // vectors list the flags they define, not unknown ones
			if enc := (hsMsg{Type: v.Type, Version: v.Version, Arg: v.Arg, Flags: v.Flags, Ticket: v.Ticket}).encode(); !bytes.Equal(enc, b) {
				t.Errorf("%s: encoded %x, want %x", v.Name, enc, b)
			}
		}
	}
}

func TestVectorsLayout(t *testing.T) {
	var vs []struct {
		Ring  uint32 `json:"ring_capacity"`
		Size  uint32 `json:"slot_size"`
		Count uint32 `json:"slot_count"`
		D     uint64 `json:"data_off"`
		P     uint64 `json:"pool_off"`
		B     uint64 `json:"block_size"`
		S     uint64 `json:"segment_size"`
	}
	loadVectors(t, "layout.json", &vs)
	for _, v := range vs {
		g := Geometry{RingCapacity: v.Ring, SlotSize: v.Size, SlotCount: v.Count}
		if err := g.valid(); err != nil {
			t.Errorf("%+v: %v", g, err)
		}
		l := g.layout()
		if l.dataOff != v.D || l.poolOff != v.P || l.blockSize != v.B || l.segmentSize != v.S {
			t.Errorf("%+v: got %d %d %d %d want %d %d %d %d", g, l.dataOff, l.poolOff, l.blockSize, l.segmentSize, v.D, v.P, v.B, v.S)
		}
	}
}

func TestVectorsHeader(t *testing.T) {
	var vs []struct {
		Name         string
		RingCapacity uint32 `json:"ring_capacity"`
		SlotSize     uint32 `json:"slot_size"`
		SlotCount    uint32 `json:"slot_count"`
		Claim        uint32
		ClientPid    uint32 `json:"client_pid"`
		ServerPid    uint32 `json:"server_pid"`
		ClientAddr   string `json:"client_addr"`
		ServerAddr   string `json:"server_addr"`
		SegmentSize  uint64 `json:"segment_size"`
		Hex          string
	}
	loadVectors(t, "header.json", &vs)
	for _, v := range vs {
		want, _ := hex.DecodeString(v.Hex)
		h := header{Geometry: Geometry{v.RingCapacity, v.SlotSize, v.SlotCount}, SegmentSize: v.SegmentSize,
			Claim: v.Claim, ClientPid: v.ClientPid, ServerPid: v.ServerPid,
			ClientAddr: netip.MustParseAddrPort(v.ClientAddr), ServerAddr: netip.MustParseAddrPort(v.ServerAddr)}
		got := make([]byte, len(want))
		h.encode(got)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: encoded\n%x\nwant\n%x", v.Name, got, want)
		}
		d, _, err := decodeHeader(want)
		if err != nil {
			t.Errorf("%s: %v", v.Name, err)
			continue
		}
		if d != h {
			t.Errorf("%s: decoded %+v, want %+v", v.Name, d, h)
		}
	}
	var bad []struct{ Name, Hex string }
	loadVectors(t, "header_invalid.json", &bad)
	if len(bad) == 0 {
		t.Fatal("no invalid vectors")
	}
	for _, v := range bad {
		b, _ := hex.DecodeString(v.Hex)
		if _, _, err := decodeHeader(b); err == nil {
			t.Errorf("%s: accepted", v.Name)
		}
	}
}

func TestVectorsRing(t *testing.T) {
	var vs []struct {
		Capacity uint64
		Head     string
		Tail     string
		Valid    bool
		Readable *uint64
		Writable *uint64
		ReadAt   *uint64 `json:"read_at"`
	}
	loadVectors(t, "ring.json", &vs)
	for _, v := range vs {
		h, _ := strconv.ParseUint(v.Head, 10, 64)
		tl, _ := strconv.ParseUint(v.Tail, 10, 64)
		r, w, ok := ringState(v.Capacity, h, tl)
		if ok != v.Valid {
			t.Errorf("%+v: ok=%v", v, ok)
			continue
		}
		if ok && (r != *v.Readable || w != *v.Writable || tl&(v.Capacity-1) != *v.ReadAt) {
			t.Errorf("%+v: got %d %d %d", v, r, w, tl&(v.Capacity-1))
		}
	}
}

func TestVectorsNames(t *testing.T) {
	var vs []struct {
		Addr   string
		Name   string
		Lookup []string
	}
	loadVectors(t, "names.json", &vs)
	for _, v := range vs {
		ap := netip.MustParseAddrPort(v.Addr)
		if got := rendezvousName(ap); got != v.Name {
			t.Errorf("%s: name %q, want %q", v.Addr, got, v.Name)
		}
		var got []string
		if isLocal(ap.Addr()) {
			got = lookupNames(ap)
		}
		if v.Lookup == nil {
			if got != nil {
				t.Errorf("%s: lookup %q, want none", v.Addr, got)
			}
			continue
		}
		if len(got) != len(v.Lookup) {
			t.Errorf("%s: lookup %q, want %q", v.Addr, got, v.Lookup)
			continue
		}
		for i := range got {
			if got[i] != v.Lookup[i] {
				t.Errorf("%s: lookup %q, want %q", v.Addr, got, v.Lookup)
			}
		}
	}
}

func TestDefaultRingCapacityFollowsTCPWmem(t *testing.T) {
	g := defaultRingCapacity()
	if g < 256<<10 || g > 64<<20 || g&(g-1) != 0 {
		t.Fatalf("default ring capacity %d: not a power of two in 256 KiB ..= 64 MiB", g)
	}
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	if err != nil {
		t.Skip(err)
	}
	var lo, def, maxWmem uint64
	if _, err := fmt.Sscan(string(b), &lo, &def, &maxWmem); err != nil {
		t.Skip(err)
	}
	if uint64(g) < min(2*maxWmem, 64<<20) || (uint64(g) > max(maxWmem, 128<<10)*4) {
		t.Fatalf("default ring capacity %d for tcp_wmem's maximum %d", g, maxWmem)
	}
}
