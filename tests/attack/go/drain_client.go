// A Go API client for tests/attack/t_rt_client_holes.sh: dials ADDR with colo.Dial, writes one
// byte, reads to end of stream, prints "client read N", waits a moment, closes, and lives on
// for a few seconds (so that what its close hands to the background unmapper is done).
// Built from the go module: cd go && go build -o X ../tests/attack/go/drain_client.go
package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"colo.dev/colo"
)

func main() {
	c, err := colo.Dial("tcp", os.Args[1])
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	if _, err := c.Write([]byte("x")); err != nil {
		fmt.Println("write:", err)
	}
	n, _ := io.Copy(io.Discard, c)
	fmt.Println("client read", n)
	time.Sleep(1500 * time.Millisecond)
	c.Close()
	time.Sleep(4 * time.Second)
}
