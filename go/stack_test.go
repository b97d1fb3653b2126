package colo

import "runtime"

func stack(buf []byte) int { return runtime.Stack(buf, true) }
