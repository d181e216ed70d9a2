package api_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/manifestcheck"
	"github.com/mandate-dev/mandate/services/audit"
)

// TestManifestMismatchIsRefusedAndAudited: a call whose relaying service
// declares another manifest (x-mandate-manifest-digest) is refused at
// request_check with manifest.mismatch before any effect, and the refusal
// leaves one refused row; a call declaring the executor's own digest, or
// none (a caller with no manifest of its own), runs.
func TestManifestMismatchIsRefusedAndAudited(t *testing.T) {
	eachStore(t, testManifestMismatchIsRefusedAndAudited)
}

func testManifestMismatchIsRefusedAndAudited(t *testing.T, st stores) {
	e := start(t, st)
	bot := token(t, "acme", "carol", "finance-bot")
	other := "sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct{ name, declared, shown string }{
		{"another manifest", other, other},
		{"a malformed digest", "sha256:NOT-A-DIGEST", "a malformed digest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.rowCount(t, "acme")
			_, err := e.execute(t, as(bot, manifestcheck.Header, tc.declared), "ticket.refund", refundInput, withKey("mm-"+tc.name))
			ce := refusal(err)
			if status.Code(err) != codes.FailedPrecondition || ce.GetStage() != "request_check" || ce.GetCode() != "manifest.mismatch" || ce.GetInvocationId() == "" {
				t.Fatalf("refused with %v %+v, want FailedPrecondition request_check manifest.mismatch", status.Code(err), ce)
			}
			if !strings.Contains(ce.GetMessage(), tc.shown) {
				t.Errorf("message %q does not name %q", ce.GetMessage(), tc.shown)
			}
			rows := e.rows(t, "acme", ce.GetInvocationId(), 1)
			if len(rows) != 1 || rows[0].Outcome != audit.OutcomeRefused || rows[0].Stage != "request_check" || rows[0].Code != "manifest.mismatch" {
				t.Fatalf("rows of the refusal: %+v", rows)
			}
			if after := e.rowCount(t, "acme"); after != before+1 {
				t.Fatalf("the trail gained %d rows, want 1", after-before)
			}
		})
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("the gateway counted %d refunds", n)
	}
	if pending, err := e.confirm.Pending(context.Background(), carol, 100); err != nil || len(pending) != 0 {
		t.Fatalf("challenges opened for refused calls: %d %v", len(pending), err)
	}
	for _, declared := range []string{manifest.SampleDigest(), ""} {
		var md []string
		if declared != "" {
			md = []string{manifestcheck.Header, declared}
		}
		if _, err := e.execute(t, as(bot, md...), "ticket.search", `{"query":"charged twice"}`); err != nil {
			t.Fatalf("declaring %q: %v", declared, err)
		}
	}
}
