// A Go API client for tests/attack/t_rt_scribble_client.sh: dials ADDR with colo.Dial N times,
// one after the other; on each connection one goroutine writes BYTES (more than the ring holds:
// it then waits for space) and another reads until an error. Prints "CONNECTED n" once every
// dial returned, then lives SECONDS. Built from the go module:
// cd go && go build -o X ../tests/attack/go/many_client.go
package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"colo.dev/colo"
)

func main() {
	n, _ := strconv.Atoi(os.Args[2])
	size, _ := strconv.Atoi(os.Args[3])
	secs, _ := strconv.Atoi(os.Args[4])
	ok := 0
	for i := 0; i < n; i++ {
		c, err := colo.Dial("tcp", os.Args[1])
		if err != nil {
			fmt.Println("dial:", err)
			continue
		}
		ok++
		go func() { c.Write(make([]byte, size)) }()
		go func() { io.Copy(io.Discard, c) }()
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println("CONNECTED", ok)
	time.Sleep(time.Duration(secs) * time.Second)
}
