// A Go API server for tests/attack/t_rt_orphan_bytes.sh: listens on ADDR with colo.ListenColo,
// prints "READY", and to each connection it accepts writes N bytes and closes it.
// Built from the go module: cd go && go build -o X ../tests/attack/go/write_close_server.go
package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"

	"colo.dev/colo"
)

func main() {
	l, err := colo.ListenColo("tcp", os.Args[1])
	if err != nil {
		fmt.Println("listen:", err)
		os.Exit(1)
	}
	n, _ := strconv.Atoi(os.Args[2])
	body := bytes.Repeat([]byte("o"), n)
	fmt.Println("READY")
	for {
		c, err := l.AcceptColo()
		if err != nil {
			fmt.Println("accept:", err)
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			c.Write(body)
		}()
	}
}
