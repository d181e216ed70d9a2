package edgelimit

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// trail is an Appender that keeps what it is given, or fails while down.
type trail struct {
	mu   sync.Mutex
	down bool
	recs []*mandatev1.AuditRecord
}

func (a *trail) Append(_ context.Context, in *mandatev1.AppendRequest, _ ...grpc.CallOption) (*mandatev1.AppendResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down {
		return nil, errors.New("audit down")
	}
	a.recs = append(a.recs, in.GetRecords()...)
	return &mandatev1.AppendResponse{Records: in.GetRecords()}, nil
}

func (a *trail) rows(user string) (one, summed []*mandatev1.AuditRecord) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.recs {
		if r.GetUserId() != user {
			continue
		}
		if strings.Contains(r.GetMessage(), "more refusals") {
			summed = append(summed, r)
		} else {
			one = append(one, r)
		}
	}
	return one, summed
}

var (
	bot   = identity.Principal{Kind: identity.KindAgent, Tenant: "acme", UserID: "carol", AgentID: "payout-bot", Model: "m"}
	alice = identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "alice"}
)

// TestRecorderBoundsRows: a principal's refusals get a row each up to its
// row burst; the rest are one row that counts them. Another principal's
// rows are its own; refusals without a tenant leave none.
func TestRecorderBoundsRows(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	a := &trail{}
	r, err := NewRecorder(RecorderConfig{Audit: a, RowRate: 1, RowBurst: 10, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	for range 25 {
		r.Record(Refusal{Principal: bot, Channel: "mcp", Code: failure.CodeRateLimited, Message: "slow down"})
	}
	for range 3 {
		r.Record(Refusal{Principal: alice, Channel: "rest", Code: failure.CodeRateLimited, Message: "slow down"})
	}
	r.Record(Refusal{Principal: identity.Principal{}, Channel: "rest", Code: failure.CodeRateLimited})
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	one, summed := a.rows("carol")
	if len(one) != 10 || len(summed) != 1 || !strings.HasPrefix(summed[0].GetMessage(), "15 more refusals (rate.limited)") {
		t.Fatalf("carol's agent: %d rows and %d summing rows (%v), want 10 and one of 15", len(one), len(summed), summed)
	}
	for _, rec := range append(one, summed...) {
		if rec.GetPhase() != "outcome" || rec.GetOutcome() != "refused" || rec.GetStage() != failure.StageRequest || rec.GetCode() != failure.CodeRateLimited ||
			rec.GetTenant() != "acme" || rec.GetAgentId() != "payout-bot" || rec.GetActorKind() != "agent" || rec.GetChannel() != "mcp" || rec.GetCommand() != "" {
			t.Fatalf("row %v", rec)
		}
	}
	if one, summed := a.rows("alice"); len(one) != 3 || len(summed) != 0 {
		t.Fatalf("alice: %d rows, %d summing, want 3 and 0", len(one), len(summed))
	}
	if n := len(a.recs); n != 14 {
		t.Fatalf("%d rows in all, want 14 (none for the refusal without a tenant)", n)
	}
}

// TestRecorderRetries: rows the audit service did not take are appended by
// a later flush, none twice.
func TestRecorderRetries(t *testing.T) {
	a := &trail{down: true}
	r, err := NewRecorder(RecorderConfig{Audit: a})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		r.Record(Refusal{Principal: alice, Channel: "rest", Code: failure.CodeRateLimited})
	}
	if err := r.Flush(context.Background()); err == nil {
		t.Fatal("flush with the audit service down succeeded")
	}
	if r.Queued() != 5 {
		t.Fatalf("%d rows queued after a failed flush, want 5", r.Queued())
	}
	a.down = false
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if one, _ := a.rows("alice"); len(one) != 5 || r.Queued() != 0 {
		t.Fatalf("%d rows appended, %d queued; want 5 and 0", len(one), r.Queued())
	}
}
