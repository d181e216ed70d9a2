package tests

import (
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// approvedRefund has finance-bot (acting for carol) ask for the sample
// refund with key over REST, and carol approve it: it returns the
// challenge, whose id is the grant the retry carries, and the body that
// carries it.
func approvedRefund(t *testing.T, tp *topology, key string) (bot, body string) {
	t.Helper()
	bot = tp.token("acme", "carol", "finance-bot")
	asked := tp.rest("executor", http.MethodPost, "/v1/commands/ticket.refund:execute", bot, `{"input":`+refundInput+`}`, "Idempotency-Key", key)
	wantProblem(t, asked, http.StatusUnprocessableEntity, "confirmation_check", "confirmation.required")
	challenge := asked.body["challenge_id"].(string)
	if _, err := tp.decide(tp.token("acme", "carol", ""), challenge, mandatev1.Decision_DECISION_APPROVE); err != nil {
		t.Fatalf("carol approves: %v", err)
	}
	return bot, `{"input":` + refundInput + `,"approval_grant_id":"` + challenge + `"}`
}

// retryUntil200 retries the call until it answers 200 or within passes,
// returning the answers it saw.
func retryUntil200(t *testing.T, within time.Duration, call func() (restResponse, error)) (restResponse, []string) {
	t.Helper()
	var answers []string
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		resp, err := call()
		switch {
		case err != nil:
			answers = append(answers, "connection error")
		case resp.status == http.StatusOK:
			return resp, append(answers, "200")
		default:
			code, _ := resp.body["code"].(string)
			answers = append(answers, code)
			if code == "confirmation.already_redeemed" {
				t.Fatalf("the approval was burnt by a call that did not run: %v", answers)
			}
		}
		if time.Since(start) > within {
			t.Fatalf("no 200 within %v: %v", within, answers)
		}
	}
}

// TestChaosApprovalSurvivesACallThatNeverRan (issue 31, item 2): carol
// approves finance-bot's refund; the approved call redeems the grant and
// then cannot make its intent durable — the executor's outbox of audit
// rows (executor.audit_spool) is locked by another transaction, as a hung
// or failing store would be — so nothing is dispatched (503
// audit.unavailable, retriable). Its retry with the same key and the same
// grant, once the store takes rows again, runs the refund — once: the
// approval was given back, not burnt — and a further retry replays it.
// (Before the intent was kept in the executor's store, the test killed the
// audit service to the same effect; an audit service that is down no
// longer stops a call: TestChaosAuditKilledUnderLoad.)
func TestChaosApprovalSurvivesACallThatNeverRan(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	const key = "grant-survives-audit"
	bot, body := approvedRefund(t, tp, key)
	call := func() (restResponse, error) {
		return tp.tryRest("executor", http.MethodPost, "/v1/commands/ticket.refund:execute", bot, body, "Idempotency-Key", key)
	}

	lock, err := tp.db.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(t.Context(), `LOCK TABLE executor.audit_spool IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	resp, err := call()
	if err != nil {
		t.Fatal(err)
	}
	wantProblem(t, resp, http.StatusServiceUnavailable, "audit", "audit.unavailable")
	if retriable, _ := resp.body["retriable"].(bool); !retriable {
		t.Errorf("the refusal %s is not retriable", resp.raw)
	}
	tp.wantRefunds(0, 0)

	if err := lock.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	resp, answers := retryUntil200(t, 15*time.Second, call)
	t.Logf("answers after the store took rows again: %v", answers)
	tp.wantRefunds(1, 2500)
	again, err := call()
	if err != nil || again.status != http.StatusOK || again.body["replayed"] != true {
		t.Errorf("a further retry: %v %d %s, want the replayed result", err, again.status, again.raw)
	}
	if again.raw != "" && resp.body["result"] == nil {
		t.Errorf("the run's answer has no result: %s", resp.raw)
	}
	tp.wantRefunds(1, 2500)
}

// TestChaosApprovalSurvivesItsExecutorsDeath (issue 31, items 1 and 2):
// the approved refund is dispatched to a frozen backend, and the executor
// holding it is killed with SIGKILL; the backend resumes, the executor is
// restarted. The retry with the same key and grant gets the refund's
// result — from the receipt if the backend ran it, by running it once with
// the grant given back if it did not — never
// confirmation.already_redeemed; one refund moves money.
func TestChaosApprovalSurvivesItsExecutorsDeath(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	const key = "grant-survives-crash"
	bot, body := approvedRefund(t, tp, key)
	call := func() (restResponse, error) {
		return tp.tryRest("executor", http.MethodPost, "/v1/commands/ticket.refund:execute", bot, body, "Idempotency-Key", key)
	}

	backend := tp.process("helpdesk")
	if err := backend.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_ = backend.cmd.Process.Signal(syscall.SIGCONT)
		}
	})
	go func() { _, _ = call() }() // dies with its executor
	for deadline := time.Now().Add(10 * time.Second); tp.count(`SELECT count(*) FROM audit.records WHERE phase = 'intent' AND command = 'ticket.refund' AND approval_challenge_id IS NOT NULL`) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the approved refund never reached dispatch")
		}
	}
	time.Sleep(200 * time.Millisecond)
	tp.kill9("executor")
	died := time.Now()
	if err := backend.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	tp.restartAt("executor", tp.executorArgs()...)

	_, answers := retryUntil200(t, 20*time.Second, call)
	t.Logf("the retry's answer %v after the executor's death: %v", time.Since(died).Round(10*time.Millisecond), answers)
	tp.wantRefunds(1, 2500)
}

// TestChaosHeldRowsSurviveShutdownWhileTheDatabaseHangs (issue 31, item
// 4): the database is frozen; calls are refused (the trail does not
// answer) and their rows can reach neither the trail nor the executor's
// store, so the executor holds them in memory. It is stopped with SIGTERM
// while the database still hangs: the rows go to its held file, fsynced.
// The database continues, the executor starts again with the same file,
// and every refusal the clients saw is in the trail.
func TestChaosHeldRowsSurviveShutdownWhileTheDatabaseHangs(t *testing.T) {
	pg := startOwnPostgres(t)
	held := filepath.Join(t.TempDir(), "held")
	tp := newTopology(t, topologyOptions{
		databaseURL:  pg.url(),
		env:          []string{"MANDATE_DATABASE_REPLY_TIMEOUT=2s"},
		executorArgs: []string{"--held-file", held},
	})
	alice := tp.token("acme", "alice", "")

	thaw := pg.freeze(t)
	const callers = 6
	var (
		mu      sync.Mutex
		refused int
		wg      sync.WaitGroup
	)
	for range callers {
		wg.Go(func() {
			resp, err := tp.tryRest("executor", http.MethodPost, "/v1/commands/ticket.search:execute", alice, `{"input":{"query":"charged twice"}}`)
			if err != nil {
				t.Errorf("a search got no answer with the database frozen: %v", err)
				return
			}
			if resp.status != http.StatusServiceUnavailable {
				t.Errorf("a search with the database frozen: %d %s, want 503", resp.status, resp.raw)
				return
			}
			mu.Lock()
			refused++
			mu.Unlock()
		})
	}
	wg.Wait()

	exe := tp.process("executor")
	exe.stopped = true
	if err := exe.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exe.done:
		if err != nil {
			t.Errorf("the executor did not stop cleanly with the database frozen: %v", err)
		}
	case <-time.After(30 * time.Second):
		// A goroutine dump in its log says what held the shutdown.
		_ = exe.cmd.Process.Signal(syscall.SIGQUIT)
		if err := <-exe.done; err != nil {
			t.Logf("the executor, on SIGQUIT: %v", err)
		}
		_ = exe.log.Close()
		thaw()
		t.Fatalf("the executor did not stop within 30 s with the database frozen; its log:\n%s", tp.logOf("executor"))
	}
	_ = exe.log.Close()
	thaw()

	tp.restartAt("executor", tp.executorArgs("--held-file", held)...)
	var rows int
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		rows = tp.count(`SELECT count(*) FROM audit.records WHERE phase = 'outcome' AND command = 'ticket.search' AND outcome <> 'executed'`)
		if rows >= refused || time.Now().After(deadline) {
			break
		}
	}
	if rows < refused {
		t.Errorf("clients saw %d refusals with the database frozen; the trail holds %d of them after the restart", refused, rows)
	}
	if out := tp.run("audit", "verify", "--tenant", "acme"); !strings.Contains(out, "intact") {
		t.Errorf("audit verify: %s", out)
	}
	t.Logf("%d refusals while the database hung, %d in the trail after the executor's restart", refused, rows)
}
