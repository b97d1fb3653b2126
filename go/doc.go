// Package colo makes connections between processes on the same host travel through shared
// memory instead of the kernel's TCP/IP stack, behind the usual net interfaces, and falls back to
// plain TCP when the peer is on another host or does not speak colo. It is a pure-Go
// implementation (no cgo) of the colo wire, spec/WIRE.md version 1, and interoperates with the
// Rust core, its C and Python bindings and unmodified programs under `colo run`.
//
// A server listens with Listen (a net.Listener that also accepts plain TCP clients); a client
// connects with Dial, DialContext or a Dialer. Both get a *Conn, which implements net.Conn with
// deadlines, half-close and net.Error timeouts, and adds zero-copy messages (Loan, Send, Recv,
// Release). HTTPTransport, H2CTransport, H2CHandler and ListenAndServe put net/http on it.
//
// Each connection is a memfd segment with two byte rings (one per direction) and optional
// message pools, and a Unix control socket, each side's one descriptor, which is the doorbell (a
// one-byte datagram wakes the peer) and whose hang-up signals the peer's death. A goroutine that
// must wait parks in the Go netpoller on the control socket, so blocked connections do not hold
// OS threads. Everything read from shared memory is validated; a peer
// that corrupts its segment gets that connection reset (EPROTO), nothing else.
package colo
