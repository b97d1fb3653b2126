package colo

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// bindTries is how many ports bindEphemeral tries before it gives up.
const bindTries = 16

// errNoPort is bindEphemeral's failure: every port tried was in use.
var errNoPort = errors.New("colo: no free ephemeral port among those tried")

// bindEphemeral binds the TCP socket fd to ip and a free odd ephemeral port, known before its
// connect (a CARRIER client keys its offer by the 4-tuple, and offers only odd ports: spec
// section 3), and returns the port. Random ports are tried rather than the kernel's bind(ip, 0):
// a port left in TIME_WAIT by a plain connection cannot be bound again (only connect may reuse
// it), and on a host that churns loopback connections the kernel's search through a range full
// of them takes milliseconds before it fails. Odd ones, as the kernel's own bind prefers: its
// connect takes even ports first and leaves them in TIME_WAIT by the thousand. errNoPort after
// bindTries ports. The same as the Rust core's colo_sys::tcp::bind_ephemeral_to.
func bindEphemeral(fd int, ip netip.Addr) (int, error) {
	lo, hi := portRange()
	span := uint64(hi-lo) + 1
	for range bindTries {
		port := (lo + int(rand.Uint64N(span))) | 1
		if port > hi || portReserved(port) {
			continue
		}
		var sa unix.Sockaddr
		if ip.Is4() {
			sa = &unix.SockaddrInet4{Addr: ip.As4(), Port: port}
		} else {
			sa = &unix.SockaddrInet6{Addr: ip.As16(), Port: port}
		}
		switch err := unix.Bind(fd, sa); err {
		case nil:
			return port, nil
		case unix.EADDRINUSE:
		default:
			return 0, err
		}
	}
	return 0, errNoPort
}

var ports struct {
	once     sync.Once
	lo, hi   int
	reserved [][2]int
}

// portRange is ip_local_port_range, read once (32768..60999 if it cannot be read).
func portRange() (int, int) {
	ports.once.Do(loadPorts)
	return ports.lo, ports.hi
}

// portReserved reports whether port is in ip_local_reserved_ports (which the kernel never hands
// out on its own), read once.
func portReserved(port int) bool {
	ports.once.Do(loadPorts)
	for _, r := range ports.reserved {
		if r[0] <= port && port <= r[1] {
			return true
		}
	}
	return false
}

func loadPorts() {
	ports.lo, ports.hi, ports.reserved = 32768, 60999, nil
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			lo, err1 := strconv.Atoi(f[0])
			hi, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && 0 < lo && lo <= hi && hi <= 65535 {
				ports.lo, ports.hi = lo, hi
			}
		}
	}
	b, _ := os.ReadFile("/proc/sys/net/ipv4/ip_local_reserved_ports")
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		a, z, _ := strings.Cut(r, "-")
		if z == "" {
			z = a
		}
		lo, err1 := strconv.Atoi(strings.TrimSpace(a))
		hi, err2 := strconv.Atoi(strings.TrimSpace(z))
		if err1 == nil && err2 == nil {
			ports.reserved = append(ports.reserved, [2]int{lo, hi})
		}
	}
}
