package colo

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

type transportLog struct {
	mu   sync.Mutex
	seen map[Transport]int
}

func (tl *transportLog) hook(ctx context.Context, c net.Conn) context.Context {
	tl.mu.Lock()
	if tl.seen == nil {
		tl.seen = map[Transport]int{}
	}
	tl.seen[ConnTransport(c)]++
	tl.mu.Unlock()
	return ctx
}

func (tl *transportLog) get() map[Transport]int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	out := map[Transport]int{}
	for k, v := range tl.seen {
		out[k] = v
	}
	return out
}

func echoHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Proto", r.Proto)
		// Read the whole body first: net/http discards unread request bodies once a response
		// grows past its buffer.
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Write(b)
	})
}

func serveHTTP(t *testing.T, h http.Handler) (*http.Server, string, *transportLog) {
	ln, err := Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := &transportLog{}
	srv := &http.Server{Handler: h, ConnContext: tl.hook}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return srv, "http://" + ln.Addr().String() + "/", tl
}

func TestHTTP1(t *testing.T) {
	watchdog(t, 60*time.Second)
	srv, url, tl := serveHTTP(t, echoHandler())
	client := &http.Client{Transport: HTTPTransport()}
	for i := 0; i < 200; i++ {
		body := make([]byte, i*37)
		for j := range body {
			body[j] = byte(j % 251)
		}
		resp, err := client.Post(url, "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(got, body) || resp.Header.Get("X-Proto") != "HTTP/1.1" {
			k := 0
			for k < len(got) && k < len(body) && got[k] == body[k] {
				k++
			}
			t.Fatalf("request %d: %d bytes, %v, %s; first diff at %d", i, len(got), err, resp.Header.Get("X-Proto"), k)
		}
	}
	if seen := tl.get(); seen[TransportColo] != 1 || seen[TransportTCP] != 0 {
		t.Fatalf("server connections by transport: %v (want one kept-alive colo connection)", seen)
	}
	// A plain net/http client reaches the same server over TCP.
	resp, err := http.Post(url, "text/plain", bytes.NewReader([]byte("tcp")))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "tcp" || tl.get()[TransportTCP] != 1 {
		t.Fatalf("plain client: %q %v", b, tl.get())
	}
	// Graceful shutdown with an idle keep-alive colo connection.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get(url); err == nil {
		t.Fatal("request after shutdown succeeded")
	}
}

func TestH2C(t *testing.T) {
	watchdog(t, 60*time.Second)
	_, url, tl := serveHTTP(t, H2CHandler(echoHandler()))
	client := &http.Client{Transport: H2CTransport()}
	var wg sync.WaitGroup
	errc := make(chan error, 50)
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			body := bytes.Repeat([]byte{byte(i)}, 1000+i*997)
			resp, err := client.Post(url, "application/octet-stream", bytes.NewReader(body))
			if err != nil {
				errc <- err
				return
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !bytes.Equal(got, body) || resp.ProtoMajor != 2 {
				errc <- errors.New("bad h2c response " + resp.Proto)
			}
		}(i)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if seen := tl.get(); seen[TransportColo] != 1 {
		t.Fatalf("server connections by transport: %v (want one multiplexed colo connection)", seen)
	}
	// The same server still speaks HTTP/1.1 through colo.
	resp, err := (&http.Client{Transport: HTTPTransport()}).Post(url, "text/plain", bytes.NewReader([]byte("h1")))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "h1" || resp.ProtoMajor != 1 {
		t.Fatalf("h1 on h2c server: %q %s", b, resp.Proto)
	}
}

func TestListenAndServe(t *testing.T) {
	watchdog(t, 30*time.Second)
	// Pick a free port, then serve on it with the helper.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	srv := &http.Server{Addr: addr, Handler: echoHandler()}
	done := make(chan error, 1)
	go func() { done <- ListenAndServe(srv) }()
	client := &http.Client{Transport: HTTPTransport()}
	var resp *http.Response
	for i := 0; i < 100; i++ {
		if resp, err = client.Post("http://"+addr+"/", "text/plain", bytes.NewReader([]byte("x"))); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	srv.Shutdown(context.Background())
	if err := <-done; err != http.ErrServerClosed {
		t.Fatalf("ListenAndServe: %v", err)
	}
}
