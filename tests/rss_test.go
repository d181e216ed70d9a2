package tests

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/internal/storage/pgtest"
)

// The memory report of issue #7: the resident set size of `mandate dev`
// idle and after 10,000 governed calls, and of each separate service after
// the same load. It measures, it does not assert: run it with
//
//	MANDATE_REPORT_RSS=1 go test ./tests -run RSS -v -count=1
//
// (the separate-services part also needs Postgres).

const rssCalls = 10000

func rssEnabled(t *testing.T) {
	t.Helper()
	if os.Getenv("MANDATE_REPORT_RSS") != "1" {
		t.Skip("set MANDATE_REPORT_RSS=1 to measure memory")
	}
}

// rssKiB reads VmRSS of a process from /proc.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no VmRSS for pid %d", pid)
	return 0
}

// load makes n governed ticket.search calls over REST with 8 callers and
// returns how many succeeded.
func rssLoad(t *testing.T, url, tok string, n int) int64 {
	t.Helper()
	var ok atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 30 * time.Second}
	for range 8 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"input":{"query":"charged twice"}}`)) //nolint:noctx // load loop
				req.Header.Set("Authorization", "Bearer "+tok)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				_ = resp.Body.Close()
				if resp.StatusCode == 200 {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return ok.Load()
}

func TestRSSDev(t *testing.T) {
	rssEnabled(t)
	dev := startDev(t)
	base, tokens, cmd := dev.base, dev.tokens, dev.cmd
	time.Sleep(2 * time.Second)
	idle := rssKiB(t, cmd.Process.Pid)
	start := time.Now()
	ok := rssLoad(t, base+"/v1/commands/ticket.search:execute", tokens["support-bot@alice"], rssCalls)
	took := time.Since(start)
	after := rssKiB(t, cmd.Process.Pid)
	t.Logf("mandate dev: RSS idle %.1f MiB, after %d calls (%d ok, %.0f calls/s) %.1f MiB",
		float64(idle)/1024, rssCalls, ok, float64(rssCalls)/took.Seconds(), float64(after)/1024)
	if ok != rssCalls {
		t.Errorf("%d of %d calls succeeded", ok, rssCalls)
	}
}

func TestRSSServices(t *testing.T) {
	rssEnabled(t)
	_, url := pgtest.NewURL(t)
	root, _ := filepath.Abs("..")
	bin := mandateBinary(t, root)
	s := &stack{t: t, bin: bin, logDir: t.TempDir(), http: map[string]string{}, env: append(os.Environ(),
		"MANDATE_DATABASE_URL="+url, "MANDATE_DEV_SECRET="+devSecret, "MANDATE_SERVICE_SECRET="+serviceSecret, "MANDATE_MANIFEST=sample")}
	s.run("migrate", "--sample")
	s.run("policy", "apply", "-f", filepath.Join(root, "examples", "policy", "demo.yaml"))
	names := []string{"audit", "confirm", "helpdesk", "catalog"}
	for _, n := range names {
		if n == "confirm" {
			s.start(n, "--audit-addr", s.http["audit-grpc"])
			continue
		}
		s.start(n)
	}
	s.start("executor",
		"--audit-addr", s.http["audit-grpc"], "--confirm-addr", s.http["confirm-grpc"],
		"--backend", "examples.helpdesk.v1.HelpdeskService="+s.http["helpdesk-grpc"]+",mandate.v1.CatalogService="+s.http["catalog-grpc"])
	s.startBridge()
	names = append(names, "executor", "mcpbridge")
	pids := rssPIDs(t, bin, s.http, names)
	time.Sleep(2 * time.Second)
	idle := map[string]int{}
	for _, n := range names {
		idle[n] = rssKiB(t, pids[n])
	}
	tok := s.token("--user", "alice", "--tenant", "acme", "--agent", "support-bot", "--model", "m")
	start := time.Now()
	ok := rssLoad(t, "http://"+s.http["executor"]+"/v1/commands/ticket.search:execute", tok, rssCalls)
	took := time.Since(start)
	t.Logf("%d REST calls (%d ok) in %s: %.0f calls/s", rssCalls, ok, took.Round(time.Millisecond), float64(rssCalls)/took.Seconds())
	// The same number again over MCP, through the bridge process: 8 sessions.
	start = time.Now()
	var mcpOK atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		cs := s.mcp(tok)
		wg.Go(func() {
			for next.Add(1) <= rssCalls {
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ticket.search", Arguments: map[string]any{"query": "charged twice"}})
				if err == nil && !res.IsError {
					mcpOK.Add(1)
				}
			}
		})
	}
	wg.Wait()
	took = time.Since(start)
	t.Logf("%d MCP calls (%d ok) in %s: %.0f calls/s", rssCalls, mcpOK.Load(), took.Round(time.Millisecond), float64(rssCalls)/took.Seconds())
	for _, n := range names {
		t.Logf("%-9s RSS idle %6.1f MiB, after %d REST + %d MCP calls %6.1f MiB", n, float64(idle[n])/1024, rssCalls, rssCalls, float64(rssKiB(t, pids[n]))/1024)
	}
}

// servicePIDs finds the started services' processes: each runs bin with
// its name as the first argument.
func rssPIDs(t *testing.T, bin string, _ map[string]string, names []string) map[string]int {
	t.Helper()
	out := map[string]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) < 2 || args[0] != bin {
			continue
		}
		out[args[1]] = pid
	}
	for _, n := range names {
		if out[n] == 0 {
			t.Fatalf("no process for %s", n)
		}
	}
	return out
}
