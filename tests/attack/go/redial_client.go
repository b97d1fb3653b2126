// A Go API client for tests/attack/t_rt_known_pid_reuse.sh: dials ADDR with colo.Dial, writes
// "x", reads its echo, closes and prints "FIRST <transport>"; then waits until the file GO
// exists, dials ADDR again, writes one byte, reads to end of stream and prints "client read N".
// Built from the go module: cd go && go build -o X ../tests/attack/go/redial_client.go
package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"colo.dev/colo"
)

func main() {
	addr, gate := os.Args[1], os.Args[2]
	time.AfterFunc(60*time.Second, func() { fmt.Println("timed out"); os.Exit(1) })
	c, err := colo.Dial("tcp", addr)
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	b := make([]byte, 1)
	if _, err := c.Write([]byte("x")); err != nil {
		fmt.Println("write:", err)
	}
	if _, err := io.ReadFull(c, b); err != nil {
		fmt.Println("read:", err)
	}
	fmt.Printf("FIRST %T\n", c)
	c.Close()
	for {
		if _, err := os.Stat(gate); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	c, err = colo.Dial("tcp", addr)
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
	time.Sleep(2 * time.Second)
}
