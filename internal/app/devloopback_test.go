package app

import "testing"

// TestLoopbackListen: `mandate dev` runs its OAuth server in loopback-dev
// (fetching client ID metadata documents from this machine) only when it
// listens on a loopback address; on any other, or on all of them, it
// fetches from public addresses only.
func TestLoopbackListen(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "127.0.0.2:8080": true, "[::1]:8080": true, "localhost:8080": true, "LOCALHOST:0": true,
		":8080": false, "0.0.0.0:8080": false, "[::]:8080": false, "192.168.1.10:8080": false, "mandate:8080": false, "127.0.0.1": false,
	} {
		if got := loopbackListen(addr); got != want {
			t.Errorf("loopbackListen(%q) = %v, want %v", addr, got, want)
		}
	}
}
