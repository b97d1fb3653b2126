// Command colo-gobench measures the Go colo package against TCP loopback and Unix sockets, in
// one run, with the servers in a separate process (this binary re-executed with -child):
//
//   - echo: 64 B request, 64 B reply, one request in flight per connection, 1/8/64/256
//     connections; p50 and p99 round-trip latency. colo is measured with the default spin
//     policy and with spinning off (blocking).
//   - http: net/http on both sides, POST of a 64 B body echoed back, persistent connections;
//     requests per second.
//   - stream: 64 KiB writes one way; GB/s.
//
// Ratios are printed against the baselines of the same run. Absolute numbers vary with the host.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"colo.dev/colo"
)

var (
	child    = flag.Bool("child", false, "run the servers (internal)")
	dur      = flag.Duration("d", 800*time.Millisecond, "measuring time per point")
	connsStr = flag.String("conns", "1,8,64,256", "connection counts")
	only     = flag.String("only", "echo,http,stream,connect", "which benchmarks")
	idle     = flag.Int("idle", 0, "instead: hold this many idle colo connections, each with a blocked reader on both ends, and report OS threads")
	idleRole = flag.String("idle-role", "", "internal")
	cpuProf  = flag.String("cpuprofile", "", "write CPU profiles to FILE.client and FILE.server (the server process's covers the whole run)")
	traceOut = flag.String("trace", "", "write runtime traces to FILE.client and FILE.server")
	httpOnly = flag.String("http", "colo,tcp", "which HTTP transports to measure (colo, tcp)")
	httpReps = flag.Int("http-reps", 3, "HTTP: runs per transport and point (alternating; the median is shown)")
)

// startProfiles starts the CPU profile and runtime trace of this process (suffix "client" or
// "server"); the returned function stops them.
func startProfiles(suffix string) func() {
	var stops []func()
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf + "." + suffix)
		if err != nil {
			fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatal(err)
		}
		stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
	}
	if *traceOut != "" {
		f, err := os.Create(*traceOut + "." + suffix)
		if err != nil {
			fatal(err)
		}
		if err := trace.Start(f); err != nil {
			fatal(err)
		}
		stops = append(stops, func() { trace.Stop(); f.Close() })
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}

type addrs struct {
	ColoEcho, ColoEchoNoSpin, TCPEcho, UnixEcho string
	ColoHTTP, TCPHTTP                           string
	ColoSink, TCPSink, UnixSink                 string
}

func main() {
	flag.Parse()
	if *child {
		runChild()
		return
	}
	if *idleRole != "" {
		idleChild()
		return
	}
	if *idle > 0 {
		idleRun(*idle)
		return
	}
	var conns []int
	for _, s := range strings.Split(*connsStr, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			fatal(err)
		}
		conns = append(conns, n)
	}
	cmd := exec.Command(os.Args[0], "-child", "-cpuprofile", *cpuProf, "-trace", *traceOut)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		fatal(err)
	}
	if err := cmd.Start(); err != nil {
		fatal(err)
	}
	defer func() {
		// SIGTERM lets the server process write its profiles; it exits on it.
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
		}
	}()
	stopProf := startProfiles("client")
	defer stopProf()
	childPid = cmd.Process.Pid
	var a addrs
	line, err := bufio.NewReader(out).ReadBytes('\n')
	if err != nil {
		fatal(err)
	}
	if err := json.Unmarshal(line, &a); err != nil {
		fatal(err)
	}
	fmt.Printf("colo-gobench: %s, GOMAXPROCS=%d, %d CPUs, %v per point, COLO_SPIN_US=%q\n",
		runtime.Version(), runtime.GOMAXPROCS(0), runtime.NumCPU(), *dur, os.Getenv("COLO_SPIN_US"))
	if strings.Contains(*only, "echo") {
		benchEcho(a, conns)
	}
	if strings.Contains(*only, "http") {
		benchHTTP(a, conns)
	}
	if strings.Contains(*only, "stream") {
		benchStream(a)
	}
	if strings.Contains(*only, "connect") {
		benchConnect(a)
	}
}

var childPid int

// cpuTime returns the CPU time (user + system) used so far by the process pid (0: this one).
func cpuTime(pid int) time.Duration {
	path := "/proc/self/stat"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/stat", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "colo-gobench:", err)
	os.Exit(1)
}

// ---- servers (child process) ----

func runChild() {
	var a addrs
	echo := func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
	}
	sink := func(c net.Conn) {
		defer c.Close()
		io.Copy(io.Discard, c)
		c.Write([]byte{1})
	}
	serve := func(l net.Listener, h func(net.Conn), spin *time.Duration) {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				if cc, ok := c.(*colo.Conn); ok && spin != nil {
					cc.SetSpin(*spin)
				}
				go h(c)
			}
		}()
	}
	coloL := func() *colo.Listener {
		l, err := colo.ListenColo("tcp", "127.0.0.1:0")
		if err != nil {
			fatal(err)
		}
		return l
	}
	tcpL := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fatal(err)
		}
		return l
	}
	dir, err := os.MkdirTemp("", "colo-gobench")
	if err != nil {
		fatal(err)
	}
	defer os.RemoveAll(dir)
	unixL := func(name string) net.Listener {
		l, err := net.Listen("unix", filepath.Join(dir, name))
		if err != nil {
			fatal(err)
		}
		return l
	}
	noSpin := time.Duration(0)
	l := coloL()
	a.ColoEcho = l.Addr().String()
	serve(l, echo, nil)
	l = coloL()
	a.ColoEchoNoSpin = l.Addr().String()
	serve(l, echo, &noSpin)
	t := tcpL()
	a.TCPEcho = t.Addr().String()
	serve(t, echo, nil)
	u := unixL("echo")
	a.UnixEcho = u.Addr().String()
	serve(u, echo, nil)

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	})
	l = coloL()
	a.ColoHTTP = l.Addr().String()
	go http.Serve(l, handler)
	t = tcpL()
	a.TCPHTTP = t.Addr().String()
	go http.Serve(t, handler)

	l = coloL()
	a.ColoSink = l.Addr().String()
	serve(l, sink, nil)
	t = tcpL()
	a.TCPSink = t.Addr().String()
	serve(t, sink, nil)
	u = unixL("sink")
	a.UnixSink = u.Addr().String()
	serve(u, sink, nil)

	stopProf := startProfiles("server")
	b, _ := json.Marshal(a)
	os.Stdout.Write(append(b, '\n'))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig // or killed by the parent's death (Pdeathsig)
	stopProf()
	os.RemoveAll(dir)
	os.Exit(0)
}

// ---- clients ----

type dialFn func() (net.Conn, error)

func coloDial(addr string, spin *time.Duration) dialFn {
	return func() (net.Conn, error) {
		c, err := colo.Dial("tcp", addr)
		if err != nil {
			return nil, err
		}
		if c.Transport() != colo.TransportColo {
			return nil, fmt.Errorf("colo dial of %s fell back to TCP", addr)
		}
		if spin != nil {
			c.SetSpin(*spin)
		}
		return c, nil
	}
}

func netDial(network, addr string) dialFn {
	return func() (net.Conn, error) { return net.Dial(network, addr) }
}

type lat struct {
	p50, p99 time.Duration
	rate     float64 // round trips per second, all connections together
}

func echoRun(dial dialFn, n int) lat {
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := dial()
		if err != nil {
			fatal(err)
		}
		conns[i] = c
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	var stop atomic.Bool
	var measuring atomic.Bool
	samples := make([][]time.Duration, n)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := make([]byte, 64)
			resp := make([]byte, 64)
			s := make([]time.Duration, 0, 1<<16)
			for !stop.Load() {
				t0 := time.Now()
				if _, err := c.Write(req); err != nil {
					fatal(err)
				}
				if _, err := io.ReadFull(c, resp); err != nil {
					fatal(err)
				}
				if measuring.Load() {
					s = append(s, time.Since(t0))
				}
			}
			samples[i] = s
		}()
	}
	time.Sleep(*dur / 4) // warm-up
	measuring.Store(true)
	time.Sleep(*dur)
	stop.Store(true)
	wg.Wait()
	var all []time.Duration
	for _, s := range samples {
		all = append(all, s...)
	}
	slices.Sort(all)
	if len(all) == 0 {
		return lat{}
	}
	return lat{all[len(all)/2], all[len(all)*99/100], float64(len(all)) / (*dur).Seconds()}
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Nanoseconds())/1000) }

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func benchEcho(a addrs, conns []int) {
	fmt.Println()
	fmt.Println("## echo, 64 B, one request in flight per connection (round trip, microseconds)")
	fmt.Println()
	fmt.Println("| conns | colo p50 | colo p99 | colo no-spin p50 | colo no-spin p99 | TCP p50 | TCP p99 | Unix p50 | Unix p99 | TCP/colo p50 | TCP/colo-no-spin p50 | colo/TCP round trips/s | colo-no-spin/TCP round trips/s |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	noSpin := time.Duration(0)
	for _, n := range conns {
		c := echoRun(coloDial(a.ColoEcho, nil), n)
		cn := echoRun(coloDial(a.ColoEchoNoSpin, &noSpin), n)
		t := echoRun(netDial("tcp", a.TCPEcho), n)
		u := echoRun(netDial("unix", a.UnixEcho), n)
		fmt.Printf("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n,
			us(c.p50), us(c.p99), us(cn.p50), us(cn.p99), us(t.p50), us(t.p99), us(u.p50), us(u.p99),
			ratio(float64(t.p50), float64(c.p50)), ratio(float64(t.p50), float64(cn.p50)),
			ratio(c.rate, t.rate), ratio(cn.rate, t.rate))
	}
}

// httpRun measures requests/s of n clients over transport tr, each with one request in flight on
// its own persistent connection. It also returns how many connections tr dialed during the run
// (n when every connection is reused).
func httpRun(url string, tr *http.Transport, n int) (float64, int64) {
	// The same pooling for both transports: every connection stays open and is reused
	// (http.DefaultTransport's MaxIdleConns of 100 would close and re-dial connections beyond it).
	tr.MaxIdleConns = 0
	tr.MaxIdleConnsPerHost = n
	tr.MaxConnsPerHost = n
	var dials atomic.Int64
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, addr)
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	body := bytes.Repeat([]byte{'x'}, 64)
	var count atomic.Int64
	var measuring, stop atomic.Bool
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				resp, err := client.Post(url, "application/octet-stream", bytes.NewReader(body))
				if err != nil {
					fatal(err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || len(b) != 64 {
					fatal(fmt.Errorf("http echo: %d bytes, %v", len(b), err))
				}
				if measuring.Load() {
					count.Add(1)
				}
			}
		}()
	}
	time.Sleep(*dur / 4)
	measuring.Store(true)
	t0 := time.Now()
	c0, s0 := cpuTime(0), cpuTime(childPid)
	time.Sleep(*dur)
	got := count.Load()
	el := time.Since(t0)
	c1, s1 := cpuTime(0), cpuTime(childPid)
	stop.Store(true)
	wg.Wait()
	if got > 0 {
		cpuPerReq = [2]float64{float64((c1 - c0).Microseconds()) / float64(got),
			float64((s1 - s0).Microseconds()) / float64(got)}
	}
	return float64(got) / el.Seconds(), dials.Load()
}

// cpuPerReq is the client's and the server's CPU time per request (microseconds) of the last
// httpRun.
var cpuPerReq [2]float64

func benchHTTP(a addrs, conns []int) {
	fmt.Println()
	fmt.Printf("## HTTP/1.1 echo, net/http both sides, 64 B body, persistent connections (requests/s, median of %d alternating runs)\n", *httpReps)
	fmt.Println()
	fmt.Println("| conns | colo req/s | TCP req/s | colo/TCP | dials colo/TCP | CPU us/req colo client+server | TCP client+server |")
	fmt.Println("|---|---|---|---|---|---|---|")
	type res struct {
		rps   float64
		dials int64
		cpu   [2]float64
	}
	med := func(v []res) res {
		slices.SortFunc(v, func(x, y res) int { return cmp.Compare(x.rps, y.rps) })
		return v[len(v)/2]
	}
	for _, n := range conns {
		var cs, ts []res
		runColo := func() {
			r, d := httpRun("http://"+a.ColoHTTP+"/", colo.HTTPTransport(), n)
			cs = append(cs, res{r, d, cpuPerReq})
		}
		runTCP := func() {
			tt := http.DefaultTransport.(*http.Transport).Clone()
			r, d := httpRun("http://"+a.TCPHTTP+"/", tt, n)
			ts = append(ts, res{r, d, cpuPerReq})
		}
		for i := 0; i < *httpReps; i++ {
			// Alternate which transport goes first, so that neither always follows the other.
			first, second := runColo, runTCP
			if i%2 == 1 {
				first, second = runTCP, runColo
			}
			if !strings.Contains(*httpOnly, "colo") {
				first, second = runTCP, func() {}
			} else if !strings.Contains(*httpOnly, "tcp") {
				first, second = runColo, func() {}
			}
			first()
			second()
		}
		var c, t res
		if len(cs) > 0 {
			c = med(cs)
		}
		if len(ts) > 0 {
			t = med(ts)
		}
		fmt.Printf("| %d | %.0f | %.0f | %s | %d/%d | %.0f+%.0f | %.0f+%.0f |\n", n, c.rps, t.rps, ratio(c.rps, t.rps),
			c.dials, t.dials, c.cpu[0], c.cpu[1], t.cpu[0], t.cpu[1])
	}
}

func streamRun(dial dialFn) float64 {
	c, err := dial()
	if err != nil {
		fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64<<10)
	var total int64
	deadline := time.Now().Add(*dur)
	t0 := time.Now()
	for time.Now().Before(deadline) {
		for i := 0; i < 16; i++ {
			if _, err := c.Write(buf); err != nil {
				fatal(err)
			}
			total += int64(len(buf))
		}
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	if _, err := io.ReadFull(c, buf[:1]); err != nil { // the sink has read everything
		fatal(err)
	}
	return float64(total) / time.Since(t0).Seconds() / 1e9
}

func benchStream(a addrs) {
	fmt.Println()
	fmt.Println("## streaming, 64 KiB writes, one connection (GB/s)")
	fmt.Println()
	fmt.Println("| colo | Unix | TCP | colo/Unix | colo/TCP |")
	fmt.Println("|---|---|---|---|---|")
	var cs, us, ts []float64
	for i := 0; i < 3; i++ {
		cs = append(cs, streamRun(coloDial(a.ColoSink, nil)))
		us = append(us, streamRun(netDial("unix", a.UnixSink)))
		ts = append(ts, streamRun(netDial("tcp", a.TCPSink)))
	}
	med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	c, u, t := med(cs), med(us), med(ts)
	fmt.Printf("| %.2f | %.2f | %.2f | %s | %s |\n", c, u, t, ratio(c, u), ratio(c, t))
}

// connectRun measures short-lived connections: dial, one 64 B echo, close.
func connectRun(dial dialFn) lat {
	var all []time.Duration
	buf := make([]byte, 64)
	deadline := time.Now().Add(*dur)
	for time.Now().Before(deadline) {
		t0 := time.Now()
		c, err := dial()
		if err != nil {
			fatal(err)
		}
		c.Write(buf)
		if _, err := io.ReadFull(c, buf); err != nil {
			fatal(err)
		}
		c.Close()
		all = append(all, time.Since(t0))
	}
	slices.Sort(all)
	return lat{p50: all[len(all)/2], p99: all[len(all)*99/100]}
}

func benchConnect(a addrs) {
	fmt.Println()
	fmt.Println("## short-lived connections: dial, one 64 B echo, close (microseconds)")
	fmt.Println()
	fmt.Println("| colo p50 | colo p99 | TCP p50 | TCP p99 | Unix p50 | Unix p99 | TCP/colo p50 |")
	fmt.Println("|---|---|---|---|---|---|---|")
	c := connectRun(coloDial(a.ColoEcho, nil))
	t := connectRun(netDial("tcp", a.TCPEcho))
	u := connectRun(netDial("unix", a.UnixEcho))
	fmt.Printf("| %s | %s | %s | %s | %s | %s | %s |\n", us(c.p50), us(c.p99), us(t.p50), us(t.p99),
		us(u.p50), us(u.p99), ratio(float64(t.p50), float64(c.p50)))
}

// ---- idle connections ----

// Each process holds at most idlePerProc connection ends (3 descriptors each), to stay under a
// 20000-descriptor limit.
const idlePerProc = 5000

func threadCount() int {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return -1
}

// idleChild is a server ("-idle-role server": listen, accept -idle connections) or a client
// ("-idle-role client ADDR": dial -idle connections); every connection gets a goroutine blocked in
// Read. It prints "READY <addr>" when listening (server), "UP <threads> <goroutines>" once all its
// connections are up, and exits when its standard input closes.
func idleChild() {
	n := *idle
	var conns []net.Conn
	hold := func(c net.Conn) {
		conns = append(conns, c)
		go io.Copy(io.Discard, c)
	}
	if *idleRole == "server" {
		l, err := colo.ListenColo("tcp", "127.0.0.1:0")
		if err != nil {
			fatal(err)
		}
		fmt.Printf("READY %s\n", l.Addr())
		for len(conns) < n {
			c, err := l.AcceptColo()
			if err != nil {
				fatal(err)
			}
			if c.Transport() != colo.TransportColo {
				fatal(fmt.Errorf("accepted a TCP connection"))
			}
			hold(c)
		}
	} else {
		for len(conns) < n {
			c, err := colo.Dial("tcp", flag.Arg(0))
			if err != nil {
				fatal(err)
			}
			if c.Transport() != colo.TransportColo {
				fatal(fmt.Errorf("dial fell back to TCP"))
			}
			hold(c)
		}
	}
	time.Sleep(500 * time.Millisecond) // let every reader park
	fmt.Printf("UP %d %d\n", threadCount(), runtime.NumGoroutine())
	io.Copy(io.Discard, os.Stdin)
}

func idleRun(total int) {
	type proc struct {
		cmd *exec.Cmd
		out *bufio.Reader
		in  io.Closer
	}
	start := func(args ...string) proc {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			fatal(err)
		}
		return proc{cmd, bufio.NewReader(out), in}
	}
	line := func(p proc) []string {
		l, err := p.out.ReadString('\n')
		if err != nil {
			fatal(fmt.Errorf("child: %v", err))
		}
		return strings.Fields(l)
	}
	var procs []proc
	t0 := time.Now()
	for left := total; left > 0; left -= idlePerProc {
		n := min(left, idlePerProc)
		srv := start("-idle", strconv.Itoa(n), "-idle-role", "server")
		addr := line(srv)[1]
		cli := start("-idle", strconv.Itoa(n), "-idle-role", "client", addr)
		procs = append(procs, srv, cli)
	}
	fmt.Printf("colo-gobench: %d idle colo connections over %d processes, a reader blocked on each end\n", total, len(procs))
	for i, p := range procs {
		f := line(p)
		role := "server"
		if i%2 == 1 {
			role = "client"
		}
		fmt.Printf("  %s process %d: %s OS threads, %s goroutines\n", role, i/2, f[1], f[2])
	}
	fmt.Printf("  set up in %v\n", time.Since(t0).Round(time.Millisecond))
	for _, p := range procs {
		p.in.Close()
		p.cmd.Wait()
	}
}
