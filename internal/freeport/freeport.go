// Package freeport hands out loopback addresses for child processes that
// must be told their address before they listen: test topologies and the
// benchmark's fleet.
//
// Asking the kernel for port 0 and closing the listener leaves a window in
// which the port is free for anyone: any process's outgoing connection or
// ":0" listener may take it, because the kernel draws both from the same
// ephemeral range. Addr therefore picks ports below that range, which the
// kernel never assigns on its own, so only a process that names the port
// explicitly can take it in the window.
package freeport

import (
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowest is the first port Addr considers: below it sit well-known and
// registered services a developer may run.
const lowest = 10000

var (
	mu        sync.Mutex
	handedOut = map[int]bool{}
)

// Addr returns a "127.0.0.1:port" that was free a moment ago and that this
// process has not handed out before. The port lies below the kernel's
// ephemeral range when the range leaves room for it; otherwise it is one
// the kernel chose.
func Addr() (string, error) {
	mu.Lock()
	defer mu.Unlock()
	lo, hi := lowest, ephemeralLow()
	for range 200 {
		port, err := candidate(lo, hi)
		if err != nil {
			return "", err
		}
		if handedOut[port] {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken by someone else
		}
		_ = ln.Close()
		handedOut[port] = true
		return addr, nil
	}
	return "", errors.New("freeport: no free loopback port found")
}

// candidate is a random port in [lo, hi), or one the kernel picks when
// that span is too narrow to be worth drawing from.
func candidate(lo, hi int) (int, error) {
	if hi-lo >= 1000 {
		return lo + rand.IntN(hi-lo), nil //nolint:gosec // G404: spreading ports, not a secret.
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range; 0 where
// it cannot be read, which makes Addr fall back to the kernel's choice.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return n
}
