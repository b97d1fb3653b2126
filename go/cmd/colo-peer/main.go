// Command colo-peer is the Go peer of the cross-language tests (tests/xlang/PEER.md).
//
//	colo-peer server ADDR stream|msg
//	colo-peer client ADDR stream BYTES
//	colo-peer client ADDR writefirst BYTES
//	colo-peer client ADDR msg COUNT SIZE
//	colo-peer client ADDR halfclose
//	colo-peer client ADDR short SECONDS colo|tcp
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"colo.dev/colo"
)

func die(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "colo-peer: "+format+"\n", args...)
	os.Exit(1)
}

func usage() {
	die("usage: colo-peer server ADDR stream|msg | client ADDR stream BYTES | client ADDR writefirst BYTES | client ADDR msg COUNT SIZE | client ADDR halfclose | client ADDR short SECONDS colo|tcp")
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		usage()
	}
	return n
}

func main() {
	a := os.Args[1:]
	if len(a) < 3 {
		usage()
	}
	switch {
	case a[0] == "server" && (a[2] == "stream" || a[2] == "msg"):
		server(a[1], a[2])
	case a[0] == "client":
		// A client never runs forever: a hang is a failure.
		time.AfterFunc(120*time.Second, func() { die("timed out") })
		switch {
		case a[2] == "stream" && len(a) == 4:
			clientStream(a[1], atoi(a[3]))
		case a[2] == "writefirst" && len(a) == 4:
			clientWriteFirst(a[1], atoi(a[3]))
		case a[2] == "msg" && len(a) == 5:
			clientMsg(a[1], atoi(a[3]), atoi(a[4]))
		case a[2] == "halfclose" && len(a) == 3:
			clientHalfClose(a[1])
		case a[2] == "short" && len(a) == 5 && (a[4] == "colo" || a[4] == "tcp"):
			clientShort(a[1], atoi(a[3]), a[4] == "tcp")
		default:
			usage()
		}
	default:
		usage()
	}
}

func server(addr, mode string) {
	l, err := colo.ListenColo("tcp", addr)
	if err != nil {
		die("listen: %v", err)
	}
	w := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(w, "READY %s\n", l.Addr())
	w.Flush()
	for {
		c, err := l.AcceptColo()
		if err != nil {
			die("accept: %v", err)
		}
		if mode == "stream" {
			go serveStream(c)
		} else {
			go serveMsg(c)
		}
	}
}

func serveStream(c *colo.Conn) {
	defer c.Close()
	if _, err := io.Copy(c, c); err != nil {
		fmt.Fprintf(os.Stderr, "colo-peer server: %v\n", err)
		return
	}
	c.CloseWrite()
}

func serveMsg(c *colo.Conn) {
	defer c.Close()
	for {
		m, err := c.Recv()
		if err != nil {
			if err != io.EOF {
				fmt.Fprintf(os.Stderr, "colo-peer server: recv: %v\n", err)
			}
			return
		}
		out, err := c.Loan(len(m.Data))
		if err != nil {
			fmt.Fprintf(os.Stderr, "colo-peer server: loan: %v\n", err)
			return
		}
		copy(out.Data, m.Data)
		if err := c.Send(out); err != nil {
			fmt.Fprintf(os.Stderr, "colo-peer server: send: %v\n", err)
			return
		}
		if err := m.Release(); err != nil {
			fmt.Fprintf(os.Stderr, "colo-peer server: release: %v\n", err)
			return
		}
	}
}

func dial(addr string, g colo.Geometry) *colo.Conn {
	d := colo.Dialer{Timeout: 10 * time.Second, Geometry: g}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		die("dial: %v", err)
	}
	return c
}

func clientStream(addr string, total int) {
	c := dial(addr, colo.Geometry{})
	defer c.Close()
	werr := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for off := 0; off < total; {
			n := min(len(buf), total-off)
			for i := 0; i < n; i++ {
				buf[i] = byte((off + i) % 251)
			}
			if _, err := c.Write(buf[:n]); err != nil {
				werr <- err
				return
			}
			off += n
		}
		werr <- c.CloseWrite()
	}()
	buf := make([]byte, 64<<10)
	got := 0
	for {
		n, err := c.Read(buf)
		for i := 0; i < n; i++ {
			if buf[i] != byte((got+i)%251) {
				die("byte %d: got %d, want %d", got+i, buf[i], (got+i)%251)
			}
		}
		got += n
		if got > total {
			die("read %d bytes, more than the %d written", got, total)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			die("read after %d bytes: %v", got, err)
		}
	}
	if err := <-werr; err != nil {
		die("write: %v", err)
	}
	if got != total {
		die("early EOF after %d of %d bytes", got, total)
	}
	fmt.Printf("OK %d %s\n", total, c.Transport())
}

// clientWriteFirst writes every byte before it reads any of the echo: the connection must buffer
// them all, as TCP does (the rings grow).
func clientWriteFirst(addr string, total int) {
	c := dial(addr, colo.Geometry{})
	defer c.Close()
	buf := make([]byte, 64<<10)
	for off := 0; off < total; {
		n := min(len(buf), total-off)
		for i := 0; i < n; i++ {
			buf[i] = byte((off + i) % 251)
		}
		if _, err := c.Write(buf[:n]); err != nil {
			die("write after %d bytes: %v", off, err)
		}
		off += n
	}
	if err := c.CloseWrite(); err != nil {
		die("close write: %v", err)
	}
	got := 0
	for {
		n, err := c.Read(buf)
		for i := 0; i < n; i++ {
			if buf[i] != byte((got+i)%251) {
				die("byte %d: got %d, want %d", got+i, buf[i], (got+i)%251)
			}
		}
		got += n
		if err == io.EOF {
			break
		}
		if err != nil {
			die("read after %d bytes: %v", got, err)
		}
	}
	if got != total {
		die("echo ended after %d of %d bytes", got, total)
	}
	fmt.Printf("OK %d %s\n", total, c.Transport())
}

func clientMsg(addr string, count, size int) {
	slot := uint32((size + 63) / 64 * 64)
	if slot == 0 {
		slot = 64
	}
	c := dial(addr, colo.Geometry{RingCapacity: 64 << 10, SlotSize: slot, SlotCount: 8})
	defer c.Close()
	for k := 0; k < count; k++ {
		m, err := c.Loan(size)
		if err != nil {
			die("loan %d: %v", k, err)
		}
		for j := range m.Data {
			m.Data[j] = byte((k + j) % 251)
		}
		if err := c.Send(m); err != nil {
			die("send %d: %v", k, err)
		}
		r, err := c.Recv()
		if err != nil {
			die("recv %d: %v", k, err)
		}
		if len(r.Data) != size {
			die("message %d: %d bytes, want %d", k, len(r.Data), size)
		}
		for j, b := range r.Data {
			if b != byte((k+j)%251) {
				die("message %d byte %d: got %d, want %d", k, j, b, (k+j)%251)
			}
		}
		if err := r.Release(); err != nil {
			die("release %d: %v", k, err)
		}
	}
	fmt.Printf("OK %d %s\n", count, c.Transport())
}

func clientHalfClose(addr string) {
	c := dial(addr, colo.Geometry{})
	defer c.Close()
	if _, err := c.Write([]byte("hello")); err != nil {
		die("write: %v", err)
	}
	if err := c.CloseWrite(); err != nil {
		die("close write: %v", err)
	}
	b, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, io.EOF) {
		die("read: %v", err)
	}
	if string(b) != "hello" {
		die("got %q, want \"hello\"", b)
	}
	fmt.Printf("OK 5 %s\n", c.Transport())
}

// clientShort dials, writes 64 B, reads their echo and closes, again and again for secs seconds
// (through colo, or plain TCP with tcp), checking every echo, and prints the rate and how many of
// the connections went over each transport.
func clientShort(addr string, secs int, tcp bool) {
	d := colo.Dialer{Timeout: 10 * time.Second, TCPOnly: tcp}
	req := make([]byte, 64)
	for i := range req {
		req[i] = byte(i % 251)
	}
	buf := make([]byte, 64)
	transports := map[string]int{}
	n := 0
	start := time.Now()
	end := start.Add(time.Duration(secs) * time.Second)
	for time.Now().Before(end) {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			die("dial %d: %v", n, err)
		}
		if _, err := c.Write(req); err != nil {
			die("write %d: %v", n, err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			die("read %d: %v", n, err)
		}
		if string(buf) != string(req) {
			die("connection %d: echo differs", n)
		}
		transports[string(c.Transport())]++
		c.Close()
		n++
	}
	el := time.Since(start)
	fmt.Printf("OK %d %.0f/s %v\n", n, float64(n)/el.Seconds(), transports)
}
