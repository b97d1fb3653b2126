// A Go API server for tests/attack/t_rt_idle_holes.sh: listens on ADDR with colo.ListenColo,
// prints "READY", and reads each connection it accepts to end of stream, discarding the bytes
// (the connection stays open until its client closes it).
// Built from the go module: cd go && go build -o X ../tests/attack/go/sink_server.go
package main

import (
	"fmt"
	"io"
	"os"

	"colo.dev/colo"
)

func main() {
	l, err := colo.ListenColo("tcp", os.Args[1])
	if err != nil {
		fmt.Println("listen:", err)
		os.Exit(1)
	}
	fmt.Println("READY")
	for {
		c, err := l.AcceptColo()
		if err != nil {
			fmt.Println("accept:", err)
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			io.Copy(io.Discard, c)
		}()
	}
}
