package colo

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
)

// dialFunc adapts a Dialer to the signature http.Transport wants.
func (d *Dialer) dialFunc() func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
}

// HTTPTransport returns a clone of http.DefaultTransport that dials through colo: servers on this
// host that listen with colo are reached through shared memory, everything else over TCP.
// Keep-alive pooling is unchanged.
//
//	client := &http.Client{Transport: colo.HTTPTransport()}
func HTTPTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&Dialer{Timeout: 30 * time.Second}).dialFunc()
	return t
}

// H2CTransport returns an HTTP/2 transport that speaks cleartext HTTP/2 (h2c, prior knowledge) to
// "http://" URLs, dialing through colo. Pair it with a server handler wrapped by H2CHandler.
func H2CTransport() *http2.Transport {
	dial := (&Dialer{Timeout: 30 * time.Second}).dialFunc()
	return &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			return dial(ctx, network, addr)
		},
	}
}

// H2CHandler wraps h so that the server also accepts cleartext HTTP/2 (h2c), with prior
// knowledge or by upgrade, next to HTTP/1.1.
func H2CHandler(h http.Handler) http.Handler { return h2c.NewHandler(h, &http2.Server{}) }

// ListenAndServe listens on srv.Addr with colo (plain TCP clients reach it too) and serves srv.
// srv.Shutdown stops it gracefully, as with http.Server.ListenAndServe.
func ListenAndServe(srv *http.Server) error {
	addr := srv.Addr
	if addr == "" {
		addr = ":http"
	}
	ln, err := Listen("tcp", addr)
	if err != nil {
		return err
	}
	return srv.Serve(ln)
}

// ConnTransport returns the transport of a connection handed to http.Server hooks such as
// ConnContext or ConnState ("" if it is not a colo *Conn).
func ConnTransport(c net.Conn) Transport {
	if cc, ok := c.(*Conn); ok {
		return cc.Transport()
	}
	return ""
}
