package colo

// readFence orders the plain loads of data before it before the atomic loads after it: the
// acquire fence of the sequence-locked read (spec section 5). amd64 keeps loads in order (TSO),
// and the compiler moves no memory access across an atomic: nothing to do.
func readFence(*uint32) {}
