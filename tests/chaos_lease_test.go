package tests

import (
	"context"
	"errors"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestRetryAfterTheHolderDiesIsAnsweredWithinSeconds (issue 31, item 1):
// the backend is frozen during a keyed dispatch, the executor holding the
// key is killed with SIGKILL, the backend resumes and the executor is
// restarted — all on the default settings (a 30 s deadline). The retry
// with the same key gets its definitive answer within 10 s of the death:
// the dead executor stops renewing its claim, which lapses within one
// lease (6 s), and the retry asks the backend's receipt at once instead
// of waiting out the deadline (before the leases were renewed, the claim
// lasted deadline + 60 s, and the answer came after ~90 s). The dead
// invocation's outcome row is in the trail within 10 s of the death too:
// the retry that asked the receipt appends it (before, it waited for the
// executor's reconciler, 2 min). The key ends with exactly one report.
func TestRetryAfterTheHolderDiesIsAnsweredWithinSeconds(t *testing.T) {
	tp := newTopology(t, topologyOptions{})
	alice := tp.token("acme", "alice", "")
	const key = "holder-dies"
	body := `{"input":{"title":"` + key + `","payroll_id":"P-0042","lines":[{"description":"Train","amount":{"currency_code":"EUR","amount_minor":"1000"},"category":"EXPENSE_CATEGORY_TRAVEL"}]}}`
	call := func() (restResponse, error) {
		return tp.tryRest("executor", http.MethodPost, "/v1/commands/expense.report.create:execute", alice, body, "Idempotency-Key", key)
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
	// The call is dispatched once its intent is in the trail.
	for deadline := time.Now().Add(10 * time.Second); tp.count(`SELECT count(*) FROM audit.records WHERE phase = 'intent' AND command = 'expense.report.create'`) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the keyed call never reached dispatch")
		}
	}
	var dead string
	if err := tp.db.QueryRow(context.Background(), `SELECT invocation_id FROM audit.records WHERE phase = 'intent' AND command = 'expense.report.create'`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	tp.kill9("executor")
	died := time.Now()
	if err := backend.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	tp.restartAt("executor", tp.executorArgs()...)

	var answers []string
	for {
		resp, err := call()
		switch {
		case err != nil:
			answers = append(answers, "connection error")
		case resp.status == http.StatusOK:
			answers = append(answers, "200")
		default:
			code, _ := resp.body["code"].(string)
			answers = append(answers, code)
		}
		if err == nil && resp.status == http.StatusOK {
			took := time.Since(died)
			t.Logf("definitive answer %v after the holder's death; answers %v", took.Round(10*time.Millisecond), answers)
			if took > 10*time.Second {
				t.Errorf("the retry's definitive answer came %v after the holder died, want within 10s", took)
			}
			break
		}
		if time.Since(died) > 40*time.Second {
			t.Fatalf("no definitive answer %v after the holder died: %v", time.Since(died), answers)
		}
		time.Sleep(250 * time.Millisecond)
	}
	// The dead invocation's trail is settled by the retry that learnt from
	// the receipt what it did — not by the executor's reconciler, 2 min
	// later, nor recorded unknown by the audit service's after 15 min.
	for {
		var outcome, code string
		err := tp.db.QueryRow(context.Background(), `SELECT outcome, code FROM audit.records WHERE invocation_id = $1 AND phase = 'outcome'`, dead).Scan(&outcome, &code)
		if err == nil {
			took := time.Since(died)
			t.Logf("the dead invocation's outcome (%s %s) is in the trail %v after its death", outcome, code, took.Round(10*time.Millisecond))
			if took > 10*time.Second {
				t.Errorf("the dead invocation's outcome came %v after its death, want within 10s", took)
			}
			if outcome != "executed" && (outcome != "failed" || code != "handler.not_executed") {
				t.Errorf("the dead invocation's outcome is %s %s, want what its receipt says (executed, or failed handler.not_executed)", outcome, code)
			}
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Since(died) > 20*time.Second {
			t.Fatalf("the dead invocation %s has no outcome row %v after its death", dead, time.Since(died))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := tp.count(`SELECT count(*) FROM helpdesk.expense_reports WHERE title = $1`, key); n != 1 {
		t.Errorf("the key has %d reports, want 1", n)
	}
	if n := tp.count(`SELECT count(*) FROM executor.idempotency WHERE key = $1 AND state = 'in_flight'`, key); n != 0 {
		t.Errorf("the key is still held in flight after its answer")
	}
}
