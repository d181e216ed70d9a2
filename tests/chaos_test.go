package tests

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// kill9 kills a topology process with SIGKILL and waits for it to be gone.
func (tp *topology) kill9(name string) {
	tp.t.Helper()
	tp.mu.Lock()
	var p *process
	for _, q := range tp.procs {
		if q.name == name && !q.stopped {
			p = q
		}
	}
	tp.mu.Unlock()
	if p == nil {
		tp.t.Fatalf("no running %s", name)
	}
	p.stopped = true
	_ = p.cmd.Process.Kill()
	if err := <-p.done; err == nil {
		tp.t.Fatalf("%s exited cleanly after SIGKILL", name)
	}
	_ = p.log.Close()
}

// restartAt starts a service again on the addresses it had, as a restarted
// pod behind its Service would be, and waits until it is healthy.
func (tp *topology) restartAt(name string, args ...string) {
	tp.t.Helper()
	ep := tp.addr[name]
	log, err := os.OpenFile(filepath.Join(tp.logDir, name+".log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		tp.t.Fatal(err)
	}
	cmd := exec.Command(tp.bin, append([]string{name, "--grpc-addr", ep.grpc, "--http-addr", ep.http}, args...)...)
	cmd.Env, cmd.Stdout, cmd.Stderr = tp.env, log, log
	if err := cmd.Start(); err != nil {
		tp.t.Fatal(err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan error, 1), log: log}
	go func() { p.done <- cmd.Wait() }()
	tp.mu.Lock()
	tp.procs = append(tp.procs, p)
	tp.mu.Unlock()
	client := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(30 * time.Second); ; {
		select {
		case err := <-p.done:
			p.done <- err
			tp.t.Fatalf("%s exited on restart (%v):\n%s", name, err, tp.logOf(name))
		default:
		}
		if resp, err := client.Get("http://" + ep.http + "/healthz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			tp.t.Fatalf("%s did not come back:\n%s", name, tp.logOf(name))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestChaosBackendKilledUnderLoad: clients create expense reports through
// the executor (REST, one idempotency key per report, retrying with the
// same key while the answer is retriable), and the helpdesk backend is
// killed with SIGKILL mid-load and restarted a second later. However the
// calls in flight ended, once it is back:
//   - every report was created exactly once (backend rows = keys), every
//     client got the one report its key names;
//   - every intent row has an outcome row, and none says failed: a call
//     cut short is unknown until its receipt settles its key;
//   - no key is left in flight; the audit chain verifies.
func TestChaosBackendKilledUnderLoad(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	alice := tp.token("acme", "alice", "")
	const workers, perWorker = 6, 6
	type result struct {
		key, report string
		attempts    int
		codes       []string
	}
	results := make(chan result, 10000)
	var wg sync.WaitGroup
	start := time.Now()
	stop := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					if i >= perWorker {
						return
					}
				default:
				}
				key := fmt.Sprintf("chaos-%d-%d", w, i)
				body := `{"input":{"title":"` + key + `","payroll_id":"P-0042","lines":[{"description":"Train","amount":{"currency_code":"EUR","amount_minor":"1000"},"category":"EXPENSE_CATEGORY_TRAVEL"}]}}`
				r := result{key: key}
				for deadline := time.Now().Add(45 * time.Second); time.Now().Before(deadline); {
					r.attempts++
					resp := tp.rest("executor", http.MethodPost, "/v1/commands/expense.report.create:execute", alice, body, "Idempotency-Key", key)
					if resp.status == http.StatusOK {
						res, _ := resp.body["result"].(map[string]any)
						r.report, _ = res["report_id"].(string)
						break
					}
					r.codes = append(r.codes, fmt.Sprint(resp.status, " ", resp.body["code"]))
					if retriable, _ := resp.body["retriable"].(bool); !retriable && resp.status != http.StatusServiceUnavailable {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				results <- r
			}
		}()
	}
	time.Sleep(400 * time.Millisecond)
	tp.kill9("helpdesk")
	killedAt := time.Since(start)
	time.Sleep(time.Second)
	tp.restartAt("helpdesk")
	backAt := time.Since(start)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	close(results)

	reports := map[string]string{}
	retried, keys := 0, 0
	for r := range results {
		keys++
		if r.report == "" {
			t.Errorf("key %s never got its report after %d attempts: %v", r.key, r.attempts, r.codes)
			continue
		}
		if r.attempts > 1 {
			retried++
		}
		if other, dup := reports[r.report]; dup {
			t.Errorf("keys %s and %s got the same report %s", other, r.key, r.report)
		}
		reports[r.report] = r.key
	}
	created := tp.count(`SELECT count(*) FROM helpdesk.expense_reports WHERE title LIKE 'chaos-%'`)
	distinct := tp.count(`SELECT count(DISTINCT title) FROM helpdesk.expense_reports WHERE title LIKE 'chaos-%'`)
	if created != keys || distinct != created {
		t.Errorf("the backend created %d reports (%d distinct titles) for %d keys", created, distinct, keys)
	}
	// Every intent has its outcome (outcome rows are written after the
	// reply: wait for them), and none says failed for a report that exists.
	var orphans int
	for deadline := time.Now().Add(15 * time.Second); ; {
		orphans = tp.count(`SELECT count(*) FROM audit.records i WHERE i.phase = 'intent' AND i.command = 'expense.report.create'
			AND NOT EXISTS (SELECT FROM audit.records o WHERE o.tenant = i.tenant AND o.invocation_id = i.invocation_id AND o.phase = 'outcome')`)
		if orphans == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if orphans != 0 {
		t.Errorf("%d intents without an outcome", orphans)
	}
	outcomes := map[string]int{}
	rows, err := tp.db.Query(t.Context(), `SELECT outcome, count(*) FROM audit.records WHERE phase = 'outcome' AND command = 'expense.report.create' GROUP BY outcome`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var o string
		var n int
		if err := rows.Scan(&o, &n); err != nil {
			t.Fatal(err)
		}
		outcomes[o] = n
	}
	rows.Close()
	// An executed outcome is one report; the rest were refused before
	// dispatch, replayed, failed with nothing done, or unknown.
	if outcomes["executed"] > created {
		t.Errorf("%d executed outcomes for %d reports", outcomes["executed"], created)
	}
	// A dispatch cut short by the kill is unknown (its receipt could not be
	// read while the backend was down), never "failed": the backend may
	// have committed it.
	if outcomes["failed"] != 0 {
		t.Errorf("%d outcomes say failed", outcomes["failed"])
	}
	if n := tp.count(`SELECT count(*) FROM executor.idempotency WHERE state = 'in_flight' AND key LIKE 'chaos-%'`); n != 0 {
		t.Errorf("%d idempotency keys left in flight", n)
	}
	out := tp.run("audit", "verify", "--tenant", "acme")
	if !strings.Contains(out, "intact") {
		t.Errorf("audit verify: %s", out)
	}
	t.Logf("%d keys, %d reports, %d retried; backend killed at %v, back at %v; outcomes %v",
		keys, created, retried, killedAt.Round(time.Millisecond), backAt.Round(time.Millisecond), outcomes)
}
