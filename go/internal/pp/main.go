package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"colo.dev/colo"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "server" {
		l, _ := colo.Listen("tcp", "127.0.0.1:0")
		fmt.Println(l.Addr())
		c, _ := l.AcceptColo()
		c.SetSpin(0)
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			c.Write(buf)
		}
	}
	cmd := exec.Command(os.Args[0], "server")
	out, _ := cmd.StdoutPipe()
	cmd.Start()
	var addr string
	fmt.Fscan(out, &addr)
	c, err := (&colo.Dialer{TCPOnly: os.Getenv("TCP") != ""}).Dial("tcp", addr)
	if err != nil {
		panic(err)
	}
	c.SetSpin(0)
	buf := make([]byte, 64)
	n := 20000
	t0 := time.Now()
	for i := 0; i < n; i++ {
		c.Write(buf)
		io.ReadFull(c, buf)
	}
	fmt.Println(time.Since(t0)/time.Duration(n), c.Transport())
	c.Close()
	cmd.Wait()
}
