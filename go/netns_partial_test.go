package colo

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// A connection from another namespace that sends the start of a PROPOSAL is waited on for the
// rest (SO_RCVLOWAT), not looked at in a loop: the rest, sent later, is answered; a peer that
// hangs up after the start is resolved at its end, not at the deadline (10 s here), and its
// bytes then read as from any socket.
func TestNetnsPartialProposal(t *testing.T) {
	watchdog(t, 60*time.Second)
	saved := netnsWait
	netnsWait = func() time.Duration { return 10 * time.Second }
	defer func() { netnsWait = saved }()
	boot, err := bootID()
	if err != nil {
		t.Skip("no boot id")
	}
	whole := netnsProposal(boot, make([]byte, 8))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	l := &Listener{}
	for _, rest := range []bool{true, false} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		c.Write(whole[:20])
		done := make(chan *Conn, 1)
		go func() { done <- l.netnsClaim(s.(*net.TCPConn)) }()
		time.Sleep(20 * time.Millisecond)
		if rest {
			c.Write(whole[20:])
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			a := make([]byte, netnsAnswerLen)
			if _, err := io.ReadFull(c, a); err != nil || !bytes.Equal(a[:8], netnsMagic) {
				t.Fatalf("the rest of the PROPOSAL was not answered: %v %x", err, a[:12])
			}
			<-done
			continue
		}
		c.(*net.TCPConn).CloseWrite()
		select {
		case got := <-done:
			if got != nil {
				t.Fatal("a partial PROPOSAL was claimed")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a peer that hung up after the start of a PROPOSAL waited for the deadline")
		}
		s.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 20)
		if _, err := io.ReadFull(s, b); err != nil || !bytes.Equal(b, whole[:20]) {
			t.Fatalf("the start of the PROPOSAL did not read as sent: %v", err)
		}
	}
}

// A client that stopped waiting for the answer and went on over plain TCP (spec/WIRE.md section
// 11, step 3) has its bytes behind its PROPOSAL: the listener answers DECLINE, not ACCEPT (whose
// HELLO would never come), and the connection goes on with the client's bytes as sent.
func TestNetnsClientWentOn(t *testing.T) {
	watchdog(t, 60*time.Second)
	l, boot := netnsTestListener(t)
	c, s := tcpPair(t)
	c.Write(append(netnsProposal(boot, make([]byte, 8)), "PING\r\n"...))
	time.Sleep(20 * time.Millisecond) // the bytes behind it are there when it is read
	if got := l.netnsClaim(s); got != nil {
		t.Fatal("claimed")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	a := make([]byte, netnsAnswerLen)
	if _, err := io.ReadFull(c, a); err != nil || !bytes.Equal(a[:8], netnsMagic) || a[8] != netnsDecline {
		t.Fatalf("answer %v %x, want DECLINE", err, a[:12])
	}
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 6)
	if _, err := io.ReadFull(s, b); err != nil || string(b) != "PING\r\n" {
		t.Fatalf("the bytes behind the PROPOSAL: %q %v", b, err)
	}
}

// A PROPOSAL queued whole before the listener looks is answered even when the wait for it
// (COLO_NETNS_WAIT_MS) passed before the look (a server program that accepts late on a loaded
// host, its goroutine waiting for a CPU): the bytes behind it read as sent, not behind the
// PROPOSAL as if it were the client's data.
func TestNetnsProposalQueuedPastTheWait(t *testing.T) {
	watchdog(t, 60*time.Second)
	saved := netnsWait
	netnsWait = func() time.Duration { return 0 } // passed before the first look
	defer func() { netnsWait = saved }()
	l, boot := netnsTestListener(t)
	c, s := tcpPair(t)
	c.Write(append(netnsProposal(boot, make([]byte, 8)), "PING\r\n"...))
	time.Sleep(20 * time.Millisecond) // queued whole when it is looked at
	if got := l.netnsClaim(s); got != nil {
		t.Fatal("claimed")
	}
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 6)
	if _, err := io.ReadFull(s, b); err != nil || string(b) != "PING\r\n" {
		t.Fatalf("the bytes behind the PROPOSAL: %q %v", b, err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	a := make([]byte, netnsAnswerLen)
	if _, err := io.ReadFull(c, a); err != nil || !bytes.Equal(a[:8], netnsMagic) || a[8] != netnsDecline {
		t.Fatalf("answer %v %x, want DECLINE", err, a[:12])
	}
}
