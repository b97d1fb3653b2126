//go:build !amd64

package colo

import "sync/atomic"

// readFence orders the plain loads of data before it before the atomic loads after it: the
// acquire fence of the sequence-locked read (spec section 5). Go has no fence of its own; a
// read-modify-write of a word of ours orders every access before it before every access after
// it on the architectures Go supports (a fully ordered atomic, as Linux's smp_mb relies on).
func readFence(w *uint32) { atomic.AddUint32(w, 0) }
