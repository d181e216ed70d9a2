package main

import (
	"net"
	"os"
	"testing"
)

// TestLaunchRetriesATakenPort: a reference server whose HTTP port another
// process took before it could listen exits; launch starts it again on
// fresh ports, and the first child is not left for stop to wait on.
func TestLaunchRetriesATakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = taken.Close() }()
	f := &fleet{dir: t.TempDir(), env: os.Environ()}
	defer func() {
		if err := f.stop(); err != nil {
			t.Error(err)
		}
	}()
	attempts := 0
	p, err := f.launch(t.Context(), "reference", 2, func(a []string) ([]string, string, string) {
		attempts++
		if attempts == 1 {
			a[1] = taken.Addr().String()
		}
		return []string{referenceMode, a[0], a[1]}, "", a[1]
	})
	if err != nil {
		t.Fatal(err)
	}
	if attempts != 2 || p.httpAddr == taken.Addr().String() {
		t.Fatalf("%d attempts, serving on %s (the taken port is %s)", attempts, p.httpAddr, taken.Addr())
	}
	if len(f.procs) != 2 || !f.procs[0].stopped || f.procs[1] != p {
		t.Fatalf("the fleet holds %d children; the first stopped: %v", len(f.procs), f.procs[0].stopped)
	}
}
