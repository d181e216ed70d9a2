package executor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/executor"
	"github.com/mandate-dev/mandate/services/executor/memory"
)

// legacyRow is a row as the previous version spooled it: the JSON of the
// audit package's Record (Go field names, Duration in nanoseconds, the
// approval with its derived Assurance).
const legacyRow = `{"InvocationID":"inv_old","Phase":"outcome","Time":"2026-01-05T09:00:00.123456Z","Tenant":"acme",` +
	`"Channel":"mcp","Command":"ticket.refund","Risk":"L3","SideEffects":["ledger"],"Idempotent":true,"Reversible":false,` +
	`"Subject":"T-1001","UserID":"carol","ActorKind":"agent","AgentID":"finance-bot","Model":"m","ModelVersion":"1",` +
	`"ConversationID":"c-1","MCPSessionID":"s-1","Approval":{"ChallengeID":"ch_1","Approver":"bob","Channel":"approval_page",` +
	`"DecidedAt":"2026-01-05T08:59:00Z","Assurance":"signed_in"},"Outcome":"failed","Stage":"audit","Code":"audit.unavailable",` +
	`"Message":"the audit trail is unavailable, so nothing was run","Arguments":{"ticket_id":"T-1001","amount":12.5},` +
	`"ArgumentsDigest":"ad","ResultDigest":"","Duration":1500000000,"TraceID":"t-1","ManifestDigest":"md"}`

// legacyRecord is legacyRow as a mandatev1 record.
func legacyRecord() *mandatev1.AuditRecord {
	return &mandatev1.AuditRecord{
		InvocationId: "inv_old", Phase: "outcome", Time: timestamppb.New(time.Date(2026, 1, 5, 9, 0, 0, 123456000, time.UTC)),
		Tenant: "acme", Channel: "mcp", Command: "ticket.refund", Risk: "L3", SideEffects: []string{"ledger"}, Idempotent: true,
		Subject: "T-1001", UserId: "carol", ActorKind: "agent", AgentId: "finance-bot", Model: "m", ModelVersion: "1",
		ConversationId: "c-1", McpSessionId: "s-1",
		Approval: &mandatev1.Approval{ChallengeId: "ch_1", Approver: "bob", Channel: "approval_page",
			DecidedAt: timestamppb.New(time.Date(2026, 1, 5, 8, 59, 0, 0, time.UTC))},
		Outcome: "failed", Stage: "audit", Code: "audit.unavailable", Message: "the audit trail is unavailable, so nothing was run",
		ArgumentsJson: `{"ticket_id":"T-1001","amount":12.5}`, ArgumentsDigest: "ad", Duration: durationpb.New(1500 * time.Millisecond),
		TraceId: "t-1", ManifestDigest: "md",
	}
}

func TestSpoolDecodesRowsOfThePreviousVersion(t *testing.T) {
	got, err := executor.DecodeSpooled([]byte(legacyRow))
	if err != nil {
		t.Fatal(err)
	}
	if want := legacyRecord(); !proto.Equal(want, got) {
		t.Fatalf("legacy row:\n got %v\nwant %v", got, want)
	}
	// A legacy row without time, duration, arguments or approval.
	got, err = executor.DecodeSpooled([]byte(`{"InvocationID":"inv_2","Phase":"outcome","Time":"0001-01-01T00:00:00Z",` +
		`"Tenant":"acme","Arguments":null,"Approval":null,"Duration":0}`))
	if err != nil {
		t.Fatal(err)
	}
	want := &mandatev1.AuditRecord{InvocationId: "inv_2", Phase: "outcome", Tenant: "acme"}
	if !proto.Equal(want, got) {
		t.Fatalf("sparse legacy row:\n got %v\nwant %v", got, want)
	}
}

func TestSpoolEncodingRoundTrips(t *testing.T) {
	for _, rec := range []*mandatev1.AuditRecord{
		legacyRecord(),
		{InvocationId: "inv_1"},
		{Tenant: "acme", Model: "{"}, // field 15 set first must not read as JSON
	} {
		b, err := executor.EncodeSpooled(rec)
		if err != nil {
			t.Fatal(err)
		}
		got, err := executor.DecodeSpooled(b)
		if err != nil {
			t.Fatalf("decoding %v: %v", rec, err)
		}
		if !proto.Equal(rec, got) {
			t.Fatalf("round trip: %v, want %v", got, rec)
		}
	}
	if _, err := executor.DecodeSpooled([]byte("{not json")); err == nil {
		t.Fatal("a broken legacy row decoded")
	}
}

// TestFlushSpoolAfterUpgrade: rows spooled by the previous version and by
// this one, side by side in the executor's store, all reach the trail.
func TestFlushSpoolAfterUpgrade(t *testing.T) {
	ctx := context.Background()
	store := memory.New(memory.Options{})
	newRec := legacyRecord()
	newRec.InvocationId, newRec.Approval = "inv_new", nil
	b, err := executor.EncodeSpooled(newRec)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range []executor.SpooledRow{
		{Tenant: "acme", InvocationID: "inv_old", Record: []byte(legacyRow), Time: time.Now()},
		{Tenant: "acme", InvocationID: "inv_new", Record: b, Time: time.Now()},
	} {
		if err := store.Spool(ctx, row); err != nil {
			t.Fatal(err)
		}
	}
	trail := &recordingAudit{}
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	e, err := executor.New(executor.Config{
		Manifest: set, Directory: noDirectory{}, Audit: trail, Confirm: noConfirm{}, Dispatcher: noDispatch{},
		Store: store, SpoolInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	n, err := e.FlushSpool(ctx)
	if err != nil || n != 2 {
		t.Fatalf("FlushSpool = %d, %v; want 2 rows", n, err)
	}
	want := []*mandatev1.AuditRecord{legacyRecord(), newRec}
	got := trail.appended()
	if len(got) != len(want) || !proto.Equal(want[0], got[0]) || !proto.Equal(want[1], got[1]) {
		t.Fatalf("appended:\n got %v\nwant %v", got, want)
	}
	if rows, err := store.Spooled(ctx, 10); err != nil || len(rows) != 0 {
		t.Fatalf("spool after the flush: %d rows, %v", len(rows), err)
	}
}

type recordingAudit struct {
	mu   sync.Mutex
	recs []*mandatev1.AuditRecord
}

func (r *recordingAudit) Append(_ context.Context, req *mandatev1.AppendRequest, _ ...grpc.CallOption) (*mandatev1.AppendResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, req.GetRecords()...)
	return &mandatev1.AppendResponse{Records: req.GetRecords()}, nil
}

func (r *recordingAudit) appended() []*mandatev1.AuditRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.recs
}

type noDirectory struct{}

func (noDirectory) Resolve(context.Context, string, string, string) (directory.Resolution, error) {
	return directory.Resolution{}, nil
}

type noConfirm struct{ executor.ConfirmClient }

type noDispatch struct{ executor.Dispatcher }
