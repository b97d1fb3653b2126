package colo_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"colo.dev/colo"
)

// A server and a client on this host: the bytes travel through shared memory.
func Example() {
	ln, err := colo.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c) // echo
		c.Close()
	}()

	c, err := colo.Dial("tcp", ln.Addr().String())
	if err != nil {
		panic(err)
	}
	defer c.Close()
	c.Write([]byte("hello"))
	c.CloseWrite()
	b, _ := io.ReadAll(c)
	fmt.Println(string(b), c.Transport())
	// Output: hello colo
}

// Zero-copy messages: loan a slot, fill it in place, send; receive a view, release it.
func ExampleConn_Loan() {
	ln, _ := colo.ListenColo("tcp", "127.0.0.1:0")
	defer ln.Close()
	go func() {
		s, err := ln.AcceptColo()
		if err != nil {
			return
		}
		defer s.Close()
		m, err := s.Recv()
		if err != nil {
			return
		}
		fmt.Printf("server got %q in place\n", m.Data)
		m.Release()
	}()
	c, _ := colo.Dial("tcp", ln.Addr().String())
	defer c.Close()
	m, _ := c.Loan(5)
	copy(m.Data, "hello")
	c.Send(m)
	c.CloseWrite()
	io.ReadAll(c) // wait for the server to finish
	// Output: server got "hello" in place
}

// net/http over colo: a server on a colo listener, a client with HTTPTransport.
func ExampleHTTPTransport() {
	ln, _ := colo.Listen("tcp", "127.0.0.1:0")
	srv := &http.Server{
		// Record each connection's transport so that handlers can see it.
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, transportKey{}, colo.ConnTransport(c))
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "served over %s", r.Context().Value(transportKey{}))
		}),
	}
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())

	client := &http.Client{Transport: colo.HTTPTransport()}
	resp, err := client.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		panic(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(string(b))
	// Output: served over colo
}

type transportKey struct{}

// A Dialer with a timeout; the context can cancel a dial too.
func ExampleDialer() {
	d := colo.Dialer{Timeout: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := d.DialContext(ctx, "tcp", "127.0.0.1:1")
	fmt.Println(errors.Is(err, context.Canceled))
	// Output: true
}
