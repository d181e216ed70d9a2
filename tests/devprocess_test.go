package tests

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// devProcess is a running `mandate dev` on free loopback ports, started by
// startDev, and the tokens it wrote.
type devProcess struct {
	// base is the HTTP base URL, e.g. http://127.0.0.1:41234.
	base               string
	httpAddr, grpcAddr string
	tokensFile         string
	tokens             map[string]string
	out                *syncBuffer
	cmd                *exec.Cmd
}

// startDev runs the README's first command — `mandate dev` with a tokens
// file — on free ports until the test ends, then stops it with Ctrl-C and
// fails the test if it does not stop cleanly within 15 s. The binary is
// built once per test run. A port taken by some other process between
// freePort and the listen is retried on fresh ports.
func startDev(t *testing.T, args ...string) *devProcess {
	t.Helper()
	root, _ := filepath.Abs("..")
	bin := mandateBinary(t, root)
	var d *devProcess
	var err error
	for range 3 {
		if d, err = launchDev(t, bin, args); !errors.Is(err, errAddrInUse) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	// The banner (tokens file, sign-in links, examples) is printed while
	// the servers already answer: wait for its last part.
	for banner := time.Now().Add(10 * time.Second); !strings.Contains(d.out.String(), "Try:") && time.Now().Before(banner); {
		time.Sleep(20 * time.Millisecond)
	}
	b, err := os.ReadFile(d.tokensFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &d.tokens); err != nil {
		t.Fatal(err)
	}
	return d
}

// launchDev starts one `mandate dev` and waits until it answers /healthz.
// It returns errAddrInUse, with nothing left running, when the process
// exited because one of its ports was taken.
func launchDev(t *testing.T, bin string, args []string) (*devProcess, error) {
	t.Helper()
	d := &devProcess{httpAddr: freePort(t), grpcAddr: freePort(t), out: &syncBuffer{}}
	d.base = "http://" + d.httpAddr
	d.tokensFile = filepath.Join(t.TempDir(), "tokens.json")
	d.cmd = exec.Command(bin, append([]string{"dev", "--http-addr", d.httpAddr, "--grpc-addr", d.grpcAddr, "--tokens-file", d.tokensFile}, args...)...)
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	if err := awaitHealthy("mandate dev", d.httpAddr, done, func() string { return tail(d.out.String(), 4000) }); err != nil {
		_ = d.cmd.Process.Kill() // still running when it never became healthy
		return nil, err
	}
	t.Cleanup(func() {
		_ = d.cmd.Process.Signal(syscall.SIGINT)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("mandate dev did not stop cleanly on Ctrl-C: %v", err)
			}
		case <-time.After(15 * time.Second):
			_ = d.cmd.Process.Kill()
			t.Error("mandate dev did not stop within 15s")
		}
		if t.Failed() {
			t.Logf("mandate dev output:\n%s", tail(d.out.String(), 6000))
		}
	})
	return d, nil
}
