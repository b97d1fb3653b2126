package colo

// Native fuzz tests (`go test -fuzz`) for every decoder of bytes another process controls: the
// handshake message a rendezvous peer sends, the segment header and geometry a client writes,
// and the shared words of a live segment (ring counters and flags, message and free queues).
// Seeds: the golden vectors (spec/vectors), added here and written to testdata/fuzz by
// rust/fuzz/gen_corpus.py; `make test-fuzz` runs each for a bounded time.

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func seedVectors(f *testing.F, name string) {
	var vs []struct{ Hex string }
	b, err := os.ReadFile("../spec/vectors/" + name)
	if err != nil {
		f.Fatal(err)
	}
	if err := json.Unmarshal(b, &vs); err != nil {
		f.Fatal(err)
	}
	for _, v := range vs {
		h, err := hex.DecodeString(v.Hex)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(h)
	}
}

// FuzzDecodeMsg: any bytes decode to an error or to a message whose encoding decodes to the
// same message and repeats the bytes the decoder read (all but byte 7, reserved and ignored).
func FuzzDecodeMsg(f *testing.F) {
	seedVectors(f, "handshake.json")
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMsg(b)
		if err != nil {
			return
		}
		if len(b) != msgSize {
			t.Fatalf("decoded a %d-byte message", len(b))
		}
		enc := m.encode()
		if string(enc[:7]) != string(b[:7]) || string(enc[8:]) != string(b[8:]) {
			t.Fatalf("encode(decode(%x)) = %x", b, enc)
		}
		if m2, err := decodeMsg(enc); err != nil || m2 != m {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", m, m2, err)
		}
	})
}

// checkLayout: every region of a valid geometry's layout lies inside its block, in order.
func checkLayout(t *testing.T, l layout) {
	n := uint64(l.SlotCount)
	switch {
	case l.freeOff()+4*n > l.dataOff, l.dataOff%1024 != 0, l.dataOff < dMsgEnt+8*n:
		t.Fatalf("%+v: entries overlap the data", l)
	case l.poolOff < l.dataOff+uint64(l.RingCapacity), l.poolOff%4096 != 0, l.poolOff+n*uint64(l.SlotSize) > l.blockSize:
		t.Fatalf("%+v: pool outside its block", l)
	case l.blockSize%4096 != 0, l.segmentSize != headerSize+2*l.blockSize:
		t.Fatalf("%+v: bad block or segment size", l)
	}
}

// FuzzDecodeHeader: any bytes decode to an error or to a header with a consistent layout that
// encodes to bytes decoding to the same header.
func FuzzDecodeHeader(f *testing.F) {
	seedVectors(f, "header.json")
	seedVectors(f, "header_invalid.json")
	f.Fuzz(func(t *testing.T, b []byte) {
		h, l, err := decodeHeader(b)
		if err != nil {
			return
		}
		checkLayout(t, l)
		if l.Geometry != h.Geometry || l.segmentSize != h.SegmentSize {
			t.Fatalf("layout %+v of header %+v", l, h)
		}
		enc := make([]byte, lineSize)
		h.encode(enc)
		h2, l2, err := decodeHeader(enc)
		// An IPv4-mapped IPv6 record is written back as IPv4, the form every consumer of the
		// addresses compares (canonical).
		unmap := func(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }
		h.ClientAddr, h.ServerAddr = unmap(h.ClientAddr), unmap(h.ServerAddr)
		if err != nil || h2 != h || l2 != l {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", h, h2, err)
		}
	})
}

// FuzzGeometry: any three numbers are refused or give a consistent layout.
func FuzzGeometry(f *testing.F) {
	f.Add(uint32(4096), uint32(0), uint32(0))
	f.Add(uint32(65536), uint32(64), uint32(65536))
	f.Add(uint32(1<<30), uint32(1<<30), uint32(65536))
	f.Fuzz(func(t *testing.T, ring, size, count uint32) {
		g := Geometry{RingCapacity: ring, SlotSize: size, SlotCount: count}
		if g.valid() == nil {
			checkLayout(t, g.layout())
		}
	})
}

// peerErr: what a side may answer a hostile segment with: EPROTO (corruption), the reset or
// shutdown that follows it, a deadline, or the pool calls' own refusals.
func peerErr(err error) bool {
	return err == nil || errors.Is(err, syscall.EPROTO) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, ErrNoPool) || errors.Is(err, ErrMessageSize) || errors.Is(err, net.ErrClosed)
}

// FuzzSegmentScribble: a live connection whose client writes arbitrary values into the shared
// words of both directions (counters, flags, queue entries) between the two sides' reads,
// writes, sends and receives. Each call ends in time with data or one of `peerErr`'s errors,
// never a panic or an out-of-range slice; both sides close.
//
// Input: the geometry (ring capacity and pool from geom), two stores (at: bit 15 picks the
// server->client block, the rest an offset into the block's control area; the 64-bit value
// hi<<32 | lo, as two numbers because the fuzzer moves a number by small steps: the two u32
// fields of a message entry, or the halves of a counter), and ops, one operation a byte (bit 7:
// the client does it, else the server; bit 6: the server->client direction for 8 and 9; the
// rest modulo 10): 0 makes the next store (alternating), 1 reads, 2 writes, 3 receives, 4
// loans and sends, 5 releases what was received, 6 shuts down writing, 7 receives without
// keeping, 8 pushes the next store's {lo, hi} as a message entry the way a producer would, 9
// pushes its lo as a free entry the way a consumer would.
func FuzzSegmentScribble(f *testing.F) {
	f.Add(byte(0), uint16(0), uint32(0), uint32(256), uint16(128), uint32(1), uint32(0), []byte{2, 1, 0, 1, 0, 1})
	f.Add(byte(13), uint16(768), uint32(1), uint32(64), uint16(256), uint32(1), uint32(0), []byte{0x84, 0, 0, 3, 5, 2, 1})
	l, err := ListenColo("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { l.Close() })
	f.Fuzz(func(t *testing.T, geom byte, at1 uint16, lo1, hi1 uint32, at2 uint16, lo2, hi2 uint32, ops []byte) {
		val1, val2 := uint64(hi1)<<32|uint64(lo1), uint64(hi2)<<32|uint64(lo2)
		watchdog(t, 20*time.Second)
		g := Geometry{RingCapacity: 4096 << (geom % 3)}
		if n := uint32(geom>>2) % 9; n > 0 {
			g.SlotCount, g.SlotSize = n, 64*uint32(1+(geom>>6)%4)
		}
		c, s := pair(t, l, &Dialer{Geometry: g})
		defer c.Close()
		defer s.Close()
		var held []*Message
		buf := make([]byte, 2*g.RingCapacity)
		check := func(what string, n, max int, err error) {
			if n < 0 || n > max || !peerErr(err) {
				t.Fatalf("%s: %d bytes (at most %d), %v", what, n, max, err)
			}
		}
		soon := func() time.Time { return time.Now().Add(time.Millisecond) }
		stores := 0
		if len(ops) > 64 {
			ops = ops[:64]
		}
		for i, op := range ops {
			side, other := s, c
			if op&0x80 != 0 {
				side, other = c, s
			}
			size := (i*4099 + int(op)*257) % len(buf)
			switch op & 0x3f % 10 {
			case 0:
				at, val := at1, val1
				if stores%2 == 1 {
					at, val = at2, val2
				}
				stores++
				base := uint64(headerSize)
				if at&0x8000 != 0 {
					base += c.lay.blockSize
				}
				binary.LittleEndian.PutUint64(c.seg[base+(uint64(at&0x7fff)%c.lay.dataOff)&^7:], val)
			case 1:
				side.SetReadDeadline(soon())
				k, err := side.Read(buf[:size])
				check("read", k, size, err)
			case 2:
				other.SetWriteDeadline(soon())
				k, err := other.Write(buf[:size])
				check("write", k, size, err)
			case 3:
				side.SetReadDeadline(soon())
				m, err := side.Recv()
				if m != nil {
					if len(m.Data) > int(g.SlotSize) {
						t.Fatalf("received %d bytes from %d-byte slots", len(m.Data), g.SlotSize)
					}
					held = append(held, m)
				}
				check("recv", 0, 0, err)
			case 4:
				other.SetWriteDeadline(soon())
				m, err := other.Loan(size % (int(g.SlotSize) + 1))
				check("loan", 0, 0, err)
				if m != nil {
					check("send", 0, 0, other.Send(m))
				}
			case 5:
				for _, m := range held {
					if err := m.Release(); err != nil && !errors.Is(err, errBadMessageUse) {
						check("release", 0, 0, err)
					}
				}
				held = nil
			case 6:
				check("close write", 0, 0, side.CloseWrite())
			case 7:
				side.SetReadDeadline(soon())
				m, err := side.Recv()
				if m != nil && len(m.Data) > int(g.SlotSize) {
					t.Fatalf("received %d bytes from %d-byte slots", len(m.Data), g.SlotSize)
				}
				check("recv", 0, 0, err)
			case 8, 9:
				if g.SlotCount == 0 {
					break
				}
				lo, hi := lo1, hi1
				if stores%2 == 1 {
					lo, hi = lo2, hi2
				}
				stores++
				base, n := uint64(headerSize), uint64(g.SlotCount)
				if op&0x40 != 0 {
					base += c.lay.blockSize
				}
				if op&0x3f%10 == 8 {
					h := atomic.LoadUint64(u64at(c.seg, base+dMsgHead))
					putLE32(c.seg, base+dMsgEnt+8*(h%n), lo)
					putLE32(c.seg, base+dMsgEnt+8*(h%n)+4, hi)
					atomic.StoreUint64(u64at(c.seg, base+dMsgHead), h+1) // SYNC POINT with Recv's load: the entry first
				} else {
					h := atomic.LoadUint64(u64at(c.seg, base+dFreeHead))
					putLE32(c.seg, base+c.lay.freeOff()+4*(h%n), lo)
					atomic.StoreUint64(u64at(c.seg, base+dFreeHead), h+1) // SYNC POINT with reclaim's load: the entry first
				}
			}
		}
	})
}
