package colo

import (
	"io"
	"net"
	"testing"
)

func benchPingPong(b *testing.B, c, s net.Conn) {
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			s.Write(buf)
		}
	}()
	buf := make([]byte, 64)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.Write(buf)
		io.ReadFull(c, buf)
	}
	b.StopTimer()
	c.Close()
	s.Close()
}

func BenchmarkPingPongColo(b *testing.B) {
	l, _ := ListenColo("tcp", "127.0.0.1:0")
	defer l.Close()
	c, s := pair(b, l, nil)
	benchPingPong(b, c, s)
}

func BenchmarkPingPongColoNoSpin(b *testing.B) {
	l, _ := ListenColo("tcp", "127.0.0.1:0")
	defer l.Close()
	c, s := pair(b, l, nil)
	c.SetSpin(0)
	s.SetSpin(0)
	benchPingPong(b, c, s)
}

func BenchmarkPingPongTCP(b *testing.B) {
	l, _ := ListenColo("tcp", "127.0.0.1:0")
	defer l.Close()
	c, s := pair(b, l, &Dialer{TCPOnly: true})
	benchPingPong(b, c, s)
}

// Connection set-up and tear-down: dial, one byte each way, close.
func benchConnect(b *testing.B, d *Dialer) {
	l, _ := ListenColo("tcp", "127.0.0.1:0")
	defer l.Close()
	go func() {
		for {
			s, err := l.AcceptColo()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 1)
				s.Read(buf)
				s.Write(buf)
				s.Close()
			}()
		}
	}()
	buf := make([]byte, 1)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, err := d.Dial("tcp", l.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		c.Write(buf)
		c.Read(buf)
		c.Close()
	}
}

func BenchmarkConnectColo(b *testing.B) { benchConnect(b, &Dialer{}) }
func BenchmarkConnectTCP(b *testing.B)  { benchConnect(b, &Dialer{TCPOnly: true}) }

// A 64-byte message round trip: loan, send, receive the echo, release (the echo side receives,
// loans, copies, sends and releases).
func BenchmarkMessagePingPongColo(b *testing.B) {
	l, _ := ListenColo("tcp", "127.0.0.1:0")
	defer l.Close()
	c, s := pair(b, l, &Dialer{Geometry: Geometry{RingCapacity: 1 << 16, SlotSize: 64, SlotCount: 256}})
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				return
			}
			out, err := s.Loan(len(m.Data))
			if err != nil {
				return
			}
			copy(out.Data, m.Data)
			m.Release()
			if s.Send(out) != nil {
				return
			}
		}
	}()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m, err := c.Loan(64)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Send(m); err != nil {
			b.Fatal(err)
		}
		if m, err = c.Recv(); err != nil {
			b.Fatal(err)
		}
		m.Release()
	}
	b.StopTimer()
	c.Close()
	s.Close()
}
