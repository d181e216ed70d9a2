package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestAddrIsFreeUniqueAndBelowTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	seen := map[string]bool{}
	for range 50 {
		addr, err := Addr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		_, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		if low-lowest >= 1000 && (port < lowest || port >= low) {
			t.Fatalf("port %d outside [%d, %d)", port, lowest, low)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s is not free: %v", addr, err)
		}
		_ = ln.Close()
	}
}

func TestANarrowSpanFallsBackToTheKernel(t *testing.T) {
	// A span of one port, and that port held: candidate must not draw from
	// the span but ask the kernel, which never hands out a held port.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	held := ln.Addr().(*net.TCPAddr).Port
	port, err := candidate(held, held+1)
	if err != nil {
		t.Fatal(err)
	}
	if port == held {
		t.Fatalf("candidate returned the held port %d", held)
	}
}
