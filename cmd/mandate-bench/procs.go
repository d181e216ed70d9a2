package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mandate-dev/mandate/internal/freeport"
)

// proc is a child process of this binary serving one server.
type proc struct {
	name      string
	cmd       *exec.Cmd
	done      chan error
	logPath   string
	statsAddr string
	httpAddr  string
	grpcAddr  string
	stopped   bool
}

// fleet starts children and stops them, newest first.
type fleet struct {
	dir   string
	env   []string
	procs []*proc
	after []func() // run by stop once every child has exited
}

func freeAddr() (string, error) { return freeport.Addr() }

func freeAddrs(n int) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		a, err := freeAddr()
		if err != nil {
			return nil, err
		}
		out[i] = a
	}
	return out, nil
}

// service starts `mandate <name> --grpc-addr … --http-addr … extra…` and
// waits until it answers /healthz.
func (f *fleet) service(ctx context.Context, name string, extra ...string) (*proc, error) {
	return f.launch(ctx, name, 3, func(a []string) (args []string, grpcAddr, httpAddr string) {
		return append([]string{childMode, a[0], name, "--grpc-addr", a[1], "--http-addr", a[2]}, extra...), a[1], a[2]
	})
}

// reference starts the ungoverned reference server, over the in-memory
// helpdesk (backendAddr empty) or over the helpdesk service at backendAddr.
func (f *fleet) reference(ctx context.Context, name, backendAddr string) (*proc, error) {
	return f.launch(ctx, name, 2, func(a []string) (args []string, grpcAddr, httpAddr string) {
		args = []string{referenceMode, a[0], a[1]}
		if backendAddr != "" {
			args = append(args, backendAddr)
		}
		return args, "", a[1]
	})
}

// launch starts a child on n fresh addresses (the first is its stats
// address) with the arguments argv makes of them, and waits until it
// answers /healthz. A child that exited because another process took one
// of its ports in the meantime is started again on fresh ones, twice at
// most.
func (f *fleet) launch(ctx context.Context, name string, n int, argv func(addrs []string) (args []string, grpcAddr, httpAddr string)) (*proc, error) {
	var err error
	for range 3 {
		var addrs []string
		if addrs, err = freeAddrs(n); err != nil {
			return nil, err
		}
		args, grpcAddr, httpAddr := argv(addrs)
		var p *proc
		if p, err = f.start(name, addrs[0], args); err != nil {
			return nil, err
		}
		p.grpcAddr, p.httpAddr = grpcAddr, httpAddr
		if err = f.waitHealthy(ctx, p); err == nil {
			return p, nil
		}
		if !p.exited() || !strings.Contains(p.logTail(), "address already in use") {
			return p, err
		}
		p.stopped = true // nothing left to stop
	}
	return nil, err
}

// once runs a one-shot `mandate` subcommand to completion.
func (f *fleet) once(ctx context.Context, args ...string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	statsAddr, err := freeAddr()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, self, append([]string{childMode, statsAddr}, args...)...) //nolint:gosec // G204: this binary, re-executed with our own arguments.
	cmd.Env = f.env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mandate %s: %w\n%s", strings.Join(args, " "), err, tail(out))
	}
	return nil
}

func (f *fleet) start(name, statsAddr string, args []string) (*proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, statsAddr: statsAddr, done: make(chan error, 1),
		logPath: filepath.Join(f.dir, fmt.Sprintf("%02d-%s.log", len(f.procs), name))}
	log, err := os.Create(p.logPath)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command(self, args...) //nolint:gosec // G204: this binary, re-executed with our own arguments.
	p.cmd.Env, p.cmd.Stdout, p.cmd.Stderr = f.env, log, log
	if err := p.cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() { p.done <- p.cmd.Wait(); _ = log.Close() }()
	f.procs = append(f.procs, p)
	return p, nil
}

func (f *fleet) waitHealthy(ctx context.Context, p *proc) error {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("%s exited before it became healthy (%w):\n%s", p.name, err, p.logTail())
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.httpAddr+"/healthz", nil)
		if resp, err := client.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s never became healthy:\n%s", p.name, p.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM to every child, newest first, kills what has not
// exited after 20 s, then runs the after hooks. It reports children that
// did not stop cleanly.
func (f *fleet) stop() error {
	err := f.stopProcs()
	for _, fn := range f.after {
		fn()
	}
	f.after = nil
	return err
}

// stopProcs stops the fleet's processes, last started first, and leaves
// what runs after them (dropping the database) to stop.
func (f *fleet) stopProcs() error {
	var errs []error
	for i := len(f.procs) - 1; i >= 0; i-- {
		p := f.procs[i]
		if p.stopped {
			continue
		}
		p.stopped = true
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-p.done:
			if err != nil {
				errs = append(errs, fmt.Errorf("%s did not stop cleanly: %w\n%s", p.name, err, p.logTail()))
			}
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			errs = append(errs, fmt.Errorf("%s did not stop within 20s (killed: %w)", p.name, <-p.done))
		}
	}
	return errors.Join(errs...)
}

// exited reports whether the child has exited, leaving its exit status
// for whoever waits next.
func (p *proc) exited() bool {
	select {
	case err := <-p.done:
		p.done <- err
		return true
	default:
		return false
	}
}

func (p *proc) logTail() string {
	b, _ := os.ReadFile(p.logPath)
	return string(tail(b))
}

func tail(b []byte) []byte {
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return bytes.TrimSpace(b)
}

// stats reads the child's counters.
func (p *proc) stats(ctx context.Context) (stats, error) {
	var s stats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.statsAddr+"/stats", nil)
	if err != nil {
		return s, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return s, fmt.Errorf("%s stats: %w", p.name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("%s stats: status %d", p.name, resp.StatusCode)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// profile starts (name set) or stops (name empty) the child's CPU profile;
// name is a file of the -profile directory.
func (p *proc) profile(ctx context.Context, name string) error {
	u := "http://" + p.statsAddr + "/profile/stop"
	if name != "" {
		u = "http://" + p.statsAddr + "/profile/start?name=" + url.QueryEscape(name)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s profile: %w", p.name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s profile: %s: %s", p.name, resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// readAll reads the counters of several children, in order.
func readAll(ctx context.Context, ps []*proc) ([]stats, error) {
	out := make([]stats, len(ps))
	for i, p := range ps {
		s, err := p.stats(ctx)
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

// sumStats adds up the counters of several children.
func sumStats(ctx context.Context, ps []*proc) (stats, error) {
	all, err := readAll(ctx, ps)
	var total stats
	for _, s := range all {
		total.Mallocs += s.Mallocs
		total.CPU += s.CPU
		total.HeapInuse += s.HeapInuse
		total.RSSKiB += s.RSSKiB
	}
	return total, err
}

// clockTicks is USER_HZ, which Linux fixes at 100 for /proc.
const clockTicks = 100

// postgresCPU is the CPU time of the Postgres backends serving database
// (their command line names it), from /proc. Other databases' backends —
// other work on a shared server — and the shared WAL writer and
// checkpointer are not counted. It reads zero where /proc is absent.
func postgresCPU(database string) time.Duration {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var ticks int64
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || !bytes.HasPrefix(cmdline, []byte("postgres: ")) || !bytes.Contains(cmdline, []byte(" "+database+" ")) {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command: state is field 3, utime 14, stime 15.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) < 13 {
			continue
		}
		u, err1 := strconv.ParseInt(fields[11], 10, 64)
		st, err2 := strconv.ParseInt(fields[12], 10, 64)
		if errors.Join(err1, err2) == nil {
			ticks += u + st
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks
}
