package tests

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// walkthroughExpect is what each shell block of the README's walk-through
// must print on stdout, in order. A new block needs a new entry: the test fails when
// the counts differ, so the README cannot grow an untested block.
var walkthroughExpect = [][]string{
	{}, // helpers
	{`"ticket_id":"T-1001"`},
	{`"code":"authorization.permission_denied"`, `"stage":"permission_check"`},
	{`"code":"confirmation.required"`, `"approval_url":"http://`, `refund-needs-a-human`},
	{`"code":"confirmation.approver_not_allowed"`, "CHALLENGE_STATE_APPROVED"},
	{`"refund_id":"RF-3001"`, `"status":"REFUND_STATUS_ACCEPTED"`, `"replayed":false`, `"replayed":true`},
	{`"refund_id":"RF-3002"`, `"status":"REFUND_STATUS_ACCEPTED"`}, // a small refund: nobody asked
	{`{"verdict":"VERDICT_ALLOWED","limit":{"id":"agent-daily-refunds","max":"5000","used":"2550","needs":"50","fits":true,"escalates":true}}`},
	{"EXPENSE_REPORT_STATE_SUBMITTED\n", "EXPENSE_REPORT_STATE_DRAFT\n", "EXPENSE_REPORT_STATE_APPROVED\n", `"code":"state.already_approved"`, `"stage":"state_check"`},
	{`"code":"entitlement.missing"`, `"stage":"entitlement_check"`},
	{`"approver":"carol"`, `"code":"authorization.permission_denied"`, `"ok":true`},
	{`["expense.report.create","expense.report.recall","expense.report.submit","mandate.check","mandate.plan","ticket.get","ticket.search"]`,
		`{"isError":true,"code":"authorization.permission_denied","stage":"permission_check"}`},
}

// TestREADMEWalkthrough starts `mandate dev` and runs the shell blocks of
// the README's "Walk-through" section as written (only the address and the
// temporary files are moved), checking what each prints.
func TestREADMEWalkthrough(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	for _, tool := range []string{"bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the walk-through needs %s", tool)
		}
	}
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := walkthroughBlocks(t, string(readme))
	if len(blocks) != len(walkthroughExpect) {
		t.Fatalf("the walk-through has %d shell blocks; walkthroughExpect lists %d", len(blocks), len(walkthroughExpect))
	}

	dev := startDev(t)
	dir := t.TempDir()
	httpAddr, tokensFile := dev.httpAddr, dev.tokensFile

	// One shell runs every block, so variables carry over as they do in a
	// reader's terminal; a marker separates the blocks' output.
	const marker = "@@walkthrough-block@@"
	var script strings.Builder
	for _, b := range blocks {
		b = strings.NewReplacer("localhost:8080", httpAddr, "/tmp/mandate-tokens.json", tokensFile,
			"/tmp/refund.json", filepath.Join(dir, "refund.json")).Replace(b)
		script.WriteString(b)
		fmt.Fprintf(&script, "\necho %s\n", marker)
	}
	sh := exec.Command("bash", "-c", script.String())
	sh.Dir = dir
	// The HTTP statuses exec_ prints go to stderr, whose writes interleave
	// with a pipeline's stdout: they are checked over the whole run.
	var stdout, stderr bytes.Buffer
	sh.Stdout, sh.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- sh.Wait() }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		_ = sh.Process.Kill()
		t.Fatalf("the walk-through did not finish in 60s:\n%s\n%s", stdout.String(), stderr.String())
	}
	if err != nil {
		t.Fatalf("the walk-through failed: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	for _, status := range []string{"→ HTTP 200", "→ HTTP 403", "→ HTTP 422"} {
		if !strings.Contains(stderr.String(), status) {
			t.Errorf("the walk-through never printed %q:\n%s", status, stderr.String())
		}
	}
	outputs := strings.Split(stdout.String(), marker+"\n")
	for i, want := range walkthroughExpect {
		got := outputs[i]
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("walk-through block %d:\n%s\nprinted:\n%s\nwhich lacks %q", i, blocks[i], got, w)
			}
		}
	}
}

// walkthroughBlocks returns the ```sh blocks between the "## Walk-through"
// heading and the next level-2 heading.
func walkthroughBlocks(t *testing.T, readme string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "\n## Walk-through\n")
	if !ok {
		t.Fatal("README.md has no \"## Walk-through\" section")
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	var blocks []string
	for {
		_, after, ok := strings.Cut(rest, "\n```sh\n")
		if !ok {
			return blocks
		}
		body, next, ok := strings.Cut(after, "\n```\n")
		if !ok {
			t.Fatal("unterminated ```sh block in the walk-through")
		}
		blocks = append(blocks, body)
		rest = "\n" + next
	}
}
