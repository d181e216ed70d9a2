package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/failure"
)

// drainShutdownTimeout is server.Config's default ShutdownTimeout, the
// bound a service's graceful stop may take.
const drainShutdownTimeout = 10 * time.Second

// drainAnswer is what one REST call of the drain load saw.
type drainAnswer struct {
	command        string
	sent, answered time.Time
	status         int
	code           string
	retriable      bool
	invocation     string
	err            error
	body           string
}

// TestDrainFinishesInFlightCallsAndTheirAuditRows: eight clients call
// ticket.search and expense.report.create over REST on the executor
// process while it receives SIGTERM. The executor stops within its shutdown
// timeout with exit status 0; every call answered 200 has its intent and
// its executed outcome in the audit trail; no intent row is left without
// its outcome; and every call not answered 200 was refused as retriable —
// 503 service.unavailable with retriable true, or a connection error —
// and only once the drain had begun. The test asserts these invariants,
// not how many calls land on which side of the signal.
func TestDrainFinishesInFlightCallsAndTheirAuditRows(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	var exe *process
	for _, p := range tp.procs {
		if p.name == "executor" {
			exe = p
		}
	}
	if exe == nil {
		t.Fatal("no executor process")
	}
	alice := tp.token("acme", "alice", "")
	base := "http://" + tp.addr["executor"].http + "/v1/commands/"
	const expense = `{"title":"Customer visit Lyon","lines":[{"description":"Train Paris-Lyon","amount":{"currency_code":"EUR","amount_minor":8900},"category":"EXPENSE_CATEGORY_TRAVEL"}],"payroll_id":"P-0042"}`

	const workers = 8
	stop := make(chan struct{})
	var (
		mu      sync.Mutex
		answers []drainAnswer
		wg      sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			// A client of its own per worker: keep-alive connections die
			// with the drain like a real client's would.
			client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				a := drainAnswer{command: "ticket.search", sent: time.Now()}
				body := `{"input":{"query":"refund"}}`
				if (w+i)%2 == 1 {
					a.command = "expense.report.create"
					body = fmt.Sprintf(`{"input":%s,"idempotency_key":"drain-%d-%d"}`, expense, w, i)
				}
				r, err := send(context.Background(), client, http.MethodPost, base+a.command+":execute", body,
					"Authorization", "Bearer "+alice, "Content-Type", "application/json")
				a.answered, a.err, a.status, a.body = time.Now(), err, r.status, r.body
				if err == nil {
					var b struct {
						InvocationID string `json:"invocation_id"`
						Code         string `json:"code"`
						Retriable    bool   `json:"retriable"`
					}
					_ = json.Unmarshal([]byte(r.body), &b)
					a.invocation, a.code, a.retriable = b.InvocationID, b.Code, b.Retriable
				}
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
				if err != nil {
					// Refused connections come back at once: do not spin.
					time.Sleep(10 * time.Millisecond)
				} else if a.status == http.StatusTooManyRequests {
					time.Sleep(100 * time.Millisecond) // as Retry-After says, roughly
				}
			}
		})
	}

	// Let the load reach a steady state, then drain the executor.
	time.Sleep(750 * time.Millisecond)
	sigterm := time.Now()
	if err := exe.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exe.stopped = true // tp.stop must not signal it again
	var exitErr error
	select {
	case exitErr = <-exe.done:
	case <-time.After(drainShutdownTimeout + 5*time.Second):
		_ = exe.cmd.Process.Kill()
		t.Logf("killed: %v", <-exe.done)
		close(stop)
		wg.Wait()
		t.Fatalf("the executor did not exit within %v of SIGTERM (killed):\n%s", drainShutdownTimeout+5*time.Second, tp.logOf("executor"))
	}
	exitAfter := time.Since(sigterm)
	// A moment of load against the stopped process: those calls must fail
	// as connection errors, nothing else.
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()

	if exitErr != nil {
		t.Errorf("the executor exited with %v after SIGTERM, want status 0:\n%s", exitErr, tp.logOf("executor"))
	}
	if exitAfter > drainShutdownTimeout {
		t.Errorf("the executor took %v to exit, more than the shutdown timeout %v", exitAfter, drainShutdownTimeout)
	}

	var successes, refusals, limited, connErrors, inFlightAtSignal, finishedInFlight int
	succeeded := map[string]string{} // invocation id → command
	for _, a := range answers {
		if a.sent.Before(sigterm) && a.answered.After(sigterm) {
			inFlightAtSignal++
		}
		switch {
		case a.err != nil:
			if a.answered.Before(sigterm) {
				t.Errorf("%s failed before the drain began: %v", a.command, a.err)
			}
			connErrors++
		case a.status == http.StatusOK:
			if a.sent.Before(sigterm) && a.answered.After(sigterm) {
				finishedInFlight++
			}
			if a.invocation == "" {
				t.Errorf("%s answered 200 without an invocation id: %s", a.command, a.body)
			}
			successes++
			succeeded[a.invocation] = a.command
		case a.status == http.StatusTooManyRequests && a.code == failure.CodeRateLimited && a.retriable:
			// Eight workers as one user can outrun the executor's
			// per-caller rate at the edge (faster since the intent is a
			// local commit): a retriable refusal, which they respect.
			limited++
		case a.status == http.StatusServiceUnavailable && a.code == failure.CodeServiceUnavailable && a.retriable:
			if a.answered.Before(sigterm) {
				t.Errorf("%s refused as %s before the drain began: %s", a.command, a.code, a.body)
			}
			refusals++
		default:
			t.Errorf("%s answered %d %s (retriable %v), neither a success nor a retriable refusal: %s",
				a.command, a.status, a.code, a.retriable, a.body)
		}
	}
	t.Logf("%d calls by %d clients: %d answered 200, %d refused 503 service.unavailable, %d 429 rate.limited, %d connection errors; "+
		"%d in flight at SIGTERM, %d of them answered 200; the executor exited %v after it",
		len(answers), workers, successes, refusals, limited, connErrors, inFlightAtSignal, finishedInFlight, exitAfter.Round(time.Millisecond))
	if successes == 0 {
		t.Fatal("no call succeeded before the drain: the load never ran")
	}

	// Every success has its intent and executed outcome, as durable rows,
	// now that the executor has exited: nothing was left to write.
	rows, err := tp.db.Query(context.Background(),
		`SELECT invocation_id, phase, outcome, command FROM audit.records WHERE tenant = 'acme'`)
	if err != nil {
		t.Fatal(err)
	}
	type trail struct{ intent, outcome, command string }
	byInvocation := map[string]*trail{}
	for rows.Next() {
		var id, phase, outcome, command string
		if err := rows.Scan(&id, &phase, &outcome, &command); err != nil {
			t.Fatal(err)
		}
		tr := byInvocation[id]
		if tr == nil {
			tr = &trail{command: command}
			byInvocation[id] = tr
		}
		switch phase {
		case "intent":
			tr.intent = outcome
		case "outcome":
			tr.outcome = outcome
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id, command := range succeeded {
		tr := byInvocation[id]
		switch {
		case tr == nil:
			t.Errorf("%s %s answered 200 but has no audit row", command, id)
		case tr.intent != "pending" || tr.outcome != "executed" || tr.command != command:
			t.Errorf("%s %s answered 200; its trail: intent %q, outcome %q, command %q", command, id, tr.intent, tr.outcome, tr.command)
		}
	}
	var orphans []string
	for id, tr := range byInvocation {
		if tr.intent != "" && tr.outcome == "" {
			orphans = append(orphans, tr.command+" "+id)
		}
	}
	if len(orphans) > 0 {
		t.Errorf("%d intent rows lack their outcome after the drain: %v", len(orphans), orphans)
	}
	if t.Failed() {
		t.Logf("--- executor log ---\n%s", tp.logOf("executor"))
	}
}
