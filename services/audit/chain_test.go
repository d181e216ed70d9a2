package audit_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/services/audit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func rec(inv string, phase audit.Phase) audit.Record {
	r := audit.Record{
		Tenant: "acme", InvocationID: inv, Phase: phase, Time: t0, Channel: audit.ChannelMCP,
		Command: "ticket.refund", Risk: audit.RiskL3, SideEffects: []string{"ledger"},
		ActorKind: audit.ActorAgent, AgentID: "bot", UserID: "alice",
	}
	if phase == audit.PhaseOutcome {
		r.Outcome = audit.OutcomeExecuted
	}
	return r.Normalize(t0)
}

// TestHashCoversEveryField changes each field of Record in turn (found by reflection, so a
// field added later is covered too) and requires the hash to change: no field can be edited
// without breaking the chain.
func TestHashCoversEveryField(t *testing.T) {
	base := rec("inv-1", audit.PhaseOutcome)
	base.Approval = &audit.Approval{ChallengeID: "c", Approver: "bob", Channel: "web", DecidedAt: t0}
	baseHash := audit.ComputeHash(audit.GenesisHash(), 1, &base)

	v := reflect.ValueOf(&base).Elem()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		t.Run(f.Name, func(t *testing.T) {
			r := base.Clone()
			fv := reflect.ValueOf(&r).Elem().Field(i)
			switch f.Name {
			case "Time":
				r.Time = r.Time.Add(time.Microsecond)
			case "Duration":
				r.Duration = time.Second
			case "Arguments":
				r.Arguments = json.RawMessage(`{"a":1}`)
			case "SideEffects":
				r.SideEffects = []string{"email"}
			case "Approval":
				r.Approval.Approver = "mallory"
			case "Idempotent", "Reversible":
				fv.SetBool(!fv.Bool())
			default:
				if fv.Kind() != reflect.String {
					t.Fatalf("field %s of kind %s has no mutation in this test; add one", f.Name, fv.Kind())
				}
				fv.SetString(fv.String() + "x")
			}
			if bytes.Equal(audit.ComputeHash(audit.GenesisHash(), 1, &r), baseHash) {
				t.Fatalf("changing %s does not change the hash", f.Name)
			}
		})
	}
	for _, tc := range []struct {
		name string
		edit func(r *audit.Record) (prev []byte, seq int64)
	}{
		{"seq", func(r *audit.Record) ([]byte, int64) { return audit.GenesisHash(), 2 }},
		{"prev hash", func(r *audit.Record) ([]byte, int64) { return bytes.Repeat([]byte{1}, 32), 1 }},
		{"approval removed", func(r *audit.Record) ([]byte, int64) { r.Approval = nil; return audit.GenesisHash(), 1 }},
		{"approval decided_at", func(r *audit.Record) ([]byte, int64) {
			r.Approval.DecidedAt = time.Time{}
			return audit.GenesisHash(), 1
		}},
		{"approval trust ceiling added", func(r *audit.Record) ([]byte, int64) {
			r.Approval.TrustCeiling = "L2"
			return audit.GenesisHash(), 1
		}},
		// Length prefixes keep field boundaries: moving a byte from one field to the next
		// must change the encoding.
		{"boundary shift", func(r *audit.Record) ([]byte, int64) {
			// Subject "" + UserID "alice" and Subject "a" + UserID "lice" concatenate alike.
			r.Subject, r.UserID = "a", "lice"
			return audit.GenesisHash(), 1
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := base.Clone()
			r.Approval = &audit.Approval{ChallengeID: "c", Approver: "bob", Channel: "web", DecidedAt: t0}
			prev, seq := tc.edit(&r)
			if bytes.Equal(audit.ComputeHash(prev, seq, &r), baseHash) {
				t.Fatal("hash unchanged")
			}
		})
	}
}

func TestNormalize(t *testing.T) {
	r := audit.Record{
		Time:        time.Date(2026, 1, 1, 10, 0, 0, 123456789, time.FixedZone("X", 7200)),
		Phase:       audit.PhaseIntent,
		SideEffects: []string{"b", "a", "b"},
		Arguments:   json.RawMessage("{ \"z\": 1,\n \"a\": [ 1 , 2 ] }"),
		Approval:    &audit.Approval{DecidedAt: time.Date(2026, 1, 1, 9, 0, 0, 999, time.UTC)},
	}
	n := r.Normalize(t0)
	if !n.Time.Equal(time.Date(2026, 1, 1, 8, 0, 0, 123456000, time.UTC)) || n.Time.Location() != time.UTC {
		t.Errorf("time = %v", n.Time)
	}
	if n.Outcome != audit.OutcomePending {
		t.Errorf("intent outcome = %q, want pending", n.Outcome)
	}
	if strings.Join(n.SideEffects, ",") != "a,b" {
		t.Errorf("side effects = %v", n.SideEffects)
	}
	if string(n.Arguments) != `{"z":1,"a":[1,2]}` {
		t.Errorf("arguments = %s", n.Arguments)
	}
	if n.Approval.DecidedAt.Nanosecond() != 0 {
		t.Errorf("decided_at not truncated: %v", n.Approval.DecidedAt)
	}
	if r.SideEffects[0] != "b" || r.Approval.DecidedAt.Nanosecond() != 999 {
		t.Error("Normalize modified its receiver's slices or approval")
	}
	if again := n.Normalize(t0.Add(time.Hour)); !reflect.DeepEqual(again, n) {
		t.Errorf("Normalize is not idempotent:\n%+v\n%+v", again, n)
	}
	if z := (audit.Record{}).Normalize(t0); !z.Time.Equal(t0) {
		t.Errorf("zero time became %v, want now", z.Time)
	}
}

// chainOf builds a valid chain of n rows for acme.
func chainOf(n int) []audit.Stored {
	var out []audit.Stored
	prev := audit.GenesisHash()
	for i := range n {
		r := rec("inv-"+string(rune('a'+i)), audit.PhaseIntent)
		s := audit.Stored{Record: r, Seq: int64(i + 1), PrevHash: prev}
		s.Hash = audit.ComputeHash(prev, s.Seq, &s.Record)
		prev = s.Hash
		out = append(out, s)
	}
	return out
}

func TestChainVerifier(t *testing.T) {
	tests := []struct {
		name    string
		tamper  func(rows []audit.Stored, head *audit.Head, hasHead *bool) []audit.Stored
		wantSeq int64
		problem audit.Problem
	}{
		{"intact", func(rows []audit.Stored, _ *audit.Head, _ *bool) []audit.Stored { return rows }, 0, ""},
		{"edited middle row", func(rows []audit.Stored, _ *audit.Head, _ *bool) []audit.Stored {
			rows[2].Message = "edited"
			return rows
		}, 3, audit.ProblemHashMismatch},
		{"edited and rehashed", func(rows []audit.Stored, _ *audit.Head, _ *bool) []audit.Stored {
			rows[2].Message = "edited"
			rows[2].Hash = audit.ComputeHash(rows[2].PrevHash, 3, &rows[2].Record)
			return rows
		}, 4, audit.ProblemPrevHashMismatch},
		{"deleted middle row", func(rows []audit.Stored, _ *audit.Head, _ *bool) []audit.Stored {
			return append(rows[:2:2], rows[3:]...)
		}, 3, audit.ProblemGap},
		{"deleted last row", func(rows []audit.Stored, _ *audit.Head, _ *bool) []audit.Stored { return rows[:4] }, 5, audit.ProblemHeadMismatch},
		{"head edited", func(rows []audit.Stored, h *audit.Head, _ *bool) []audit.Stored {
			h.Hash = bytes.Repeat([]byte{7}, 32)
			return rows
		}, 5, audit.ProblemHeadMismatch},
		{"head behind", func(rows []audit.Stored, h *audit.Head, _ *bool) []audit.Stored { h.Seq = 3; return rows }, 4, audit.ProblemHeadMismatch},
		{"head missing", func(rows []audit.Stored, _ *audit.Head, has *bool) []audit.Stored { *has = false; return rows }, 5, audit.ProblemHeadMismatch},
		{"row of another tenant", func(rows []audit.Stored, _ *audit.Head, _ *bool) []audit.Stored {
			rows[1].Tenant = "globex"
			return rows
		}, 2, audit.ProblemHashMismatch},
		{"duplicate seq", func(rows []audit.Stored, _ *audit.Head, _ *bool) []audit.Stored {
			return append(rows[:3:3], rows[2:]...)
		}, 3, audit.ProblemGap},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows := chainOf(5)
			head := audit.Head{Seq: 5, Hash: rows[4].Hash}
			hasHead := true
			rows = tt.tamper(rows, &head, &hasHead)
			v := audit.NewChainVerifier("acme")
			for i := range rows {
				if !v.Add(&rows[i]) {
					break
				}
			}
			rep := v.Finish(head, hasHead)
			if tt.problem == "" {
				if !rep.OK || rep.Rows != 5 || rep.Err() != nil {
					t.Fatalf("report = %+v", rep)
				}
				return
			}
			if rep.OK || rep.Break == nil || rep.Break.Seq != tt.wantSeq || rep.Break.Problem != tt.problem {
				t.Fatalf("report = %+v, break %+v; want seq %d %s", rep, rep.Break, tt.wantSeq, tt.problem)
			}
			if !errors.Is(rep.Err(), audit.ErrChainBroken) {
				t.Fatalf("Err() = %v", rep.Err())
			}
		})
	}
	// An empty tenant without a head is intact.
	if rep := audit.NewChainVerifier("none").Finish(audit.Head{}, false); !rep.OK || rep.Rows != 0 {
		t.Fatalf("empty chain: %+v", rep)
	}
}

// TestChainVerifierAt walks the newest part of a chain, as a store that evicts its oldest
// rows does: the kept rows verify from the PrevHash of the first of them, and tampering inside
// them is still found.
func TestChainVerifierAt(t *testing.T) {
	rows := chainOf(6)[2:] // rows 3..6; 1 and 2 were evicted
	head := audit.Head{Seq: 6, Hash: rows[3].Hash}
	walk := func(rows []audit.Stored, prev []byte) audit.Report {
		v := audit.NewChainVerifierAt("acme", 3, prev)
		for i := range rows {
			if !v.Add(&rows[i]) {
				break
			}
		}
		return v.Finish(head, true)
	}
	if rep := walk(rows, rows[0].PrevHash); !rep.OK || rep.Rows != 4 {
		t.Fatalf("kept rows: report %+v, break %+v; want ok with 4 rows", rep, rep.Break)
	}
	if rep := walk(rows[1:], rows[0].PrevHash); rep.OK || rep.Break.Seq != 3 || rep.Break.Problem != audit.ProblemGap {
		t.Fatalf("oldest kept row missing: report %+v, break %+v; want a gap at 3", rep, rep.Break)
	}
	edited := slices.Clone(rows)
	edited[0].PrevHash = bytes.Repeat([]byte{7}, audit.HashSize)
	if rep := walk(edited, edited[0].PrevHash); rep.OK || rep.Break.Seq != 3 || rep.Break.Problem != audit.ProblemHashMismatch {
		t.Fatalf("oldest kept row's prev_hash edited: report %+v, break %+v; want a hash mismatch at 3", rep, rep.Break)
	}
}

func TestPageToken(t *testing.T) {
	yes := true
	base := audit.Filter{Tenant: "acme", Risks: []audit.Risk{audit.RiskL4, audit.RiskL3}, Approved: &yes, From: t0}
	p, err := base.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	tok := p.NextPageToken(42)
	tests := []struct {
		name   string
		edit   func(f *audit.Filter)
		want   error
		cursor int64
	}{
		{"same filter", func(*audit.Filter) {}, nil, 42},
		{"same filter, other page size", func(f *audit.Filter) { f.PageSize = 7 }, nil, 42},
		{"same sets in another order", func(f *audit.Filter) { f.Risks = []audit.Risk{audit.RiskL3, audit.RiskL4, audit.RiskL3} }, nil, 42},
		{"other tenant", func(f *audit.Filter) { f.Tenant = "globex" }, audit.ErrInvalidPageToken, 0},
		{"other risks", func(f *audit.Filter) { f.Risks = []audit.Risk{audit.RiskL4} }, audit.ErrInvalidPageToken, 0},
		{"approved flipped", func(f *audit.Filter) { no := false; f.Approved = &no }, audit.ErrInvalidPageToken, 0},
		{"approved unset", func(f *audit.Filter) { f.Approved = nil }, audit.ErrInvalidPageToken, 0},
		{"other from", func(f *audit.Filter) { f.From = t0.Add(time.Second) }, audit.ErrInvalidPageToken, 0},
		{"field moved between strings", func(f *audit.Filter) { f.Tenant, f.AgentID = "acm", "e" }, audit.ErrInvalidPageToken, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := base
			tt.edit(&f)
			f.PageToken = tok
			got, err := f.Prepare()
			if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if err == nil && got.BeforeSeq != tt.cursor {
				t.Fatalf("cursor = %d, want %d", got.BeforeSeq, tt.cursor)
			}
		})
	}
	for _, bad := range []string{"!!", "AAAA", tok[:len(tok)-2], strings.ToUpper(tok)} {
		f := base
		f.PageToken = bad
		if _, err := f.Prepare(); !errors.Is(err, audit.ErrInvalidPageToken) || !errors.Is(err, audit.ErrInvalid) {
			t.Errorf("token %q: err = %v", bad, err)
		}
	}
	if p, _ := (audit.Filter{Tenant: "a", PageSize: 5000}).Prepare(); p.PageSize != audit.MaxPageSize {
		t.Errorf("page size 5000 became %d", p.PageSize)
	}
	if p, _ := (audit.Filter{Tenant: "a"}).Prepare(); p.PageSize != audit.DefaultPageSize {
		t.Errorf("default page size %d", p.PageSize)
	}
	// To is exclusive and rounded up to the microsecond, so a row at the truncated instant
	// before it stays included.
	to := time.Date(2026, 1, 1, 0, 0, 0, 1500, time.UTC)
	p2, _ := (audit.Filter{Tenant: "a", To: to}).Prepare()
	row := audit.Stored{Record: audit.Record{Tenant: "a", Time: time.Date(2026, 1, 1, 0, 0, 0, 1000, time.UTC)}}
	if !p2.Match(&row) {
		t.Error("a row at 1µs is excluded by To = 1.5µs")
	}
}

// pinnedRecord sets every field of Record, for TestHashIsPinned.
func pinnedRecord() audit.Record {
	at := time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)
	return audit.Record{
		InvocationID: "inv-1", Phase: audit.PhaseOutcome, Time: at, Tenant: "acme", Channel: audit.ChannelMCP,
		Command: "ticket.refund", Risk: audit.RiskL3, SideEffects: []string{"ledger", "payment-gateway"},
		Idempotent: true, Subject: "ticket/42", UserID: "alice", ActorKind: audit.ActorAgent, AgentID: "bot",
		Model: "claude", ModelVersion: "4.5", ConversationID: "conv-1", MCPSessionID: "sess-1",
		Approval: &audit.Approval{ChallengeID: "ch-1", Approver: "bob", Channel: "approval_page", DecidedAt: at.Add(-time.Second)},
		Outcome:  audit.OutcomeExecuted, Stage: "dispatch", Code: "ok", Message: "refunded",
		Arguments: json.RawMessage(`{"amount":1250,"ticket_id":"42"}`), ArgumentsDigest: "sha256:args",
		ResultDigest: "sha256:res", Duration: 1500 * time.Millisecond, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
		ManifestDigest: "sha256:manifest",
	}
}

// TestHashIsPinned holds ComputeHash to the values it has always produced: stored trails were
// chained with them, so any change to the encoding, however harmless it looks, breaks every
// existing chain. The second row has no approval and no arguments, the other branches.
func TestHashIsPinned(t *testing.T) {
	first := pinnedRecord()
	h1 := audit.ComputeHash(audit.GenesisHash(), 7, &first)
	if got, want := hex.EncodeToString(h1), "e30a7106bcd2a335d0cb4b8c1919ee6700624f8b5a8166c4b573c2a4415a8b89"; got != want {
		t.Errorf("hash of the full row = %s, want %s", got, want)
	}
	second := rec("inv-2", audit.PhaseIntent)
	h2 := audit.ComputeHash(h1, 8, &second)
	if got, want := hex.EncodeToString(h2), "648b175893778598656c67b24552236ef1f62bbe9fdbd44afa0783d4b8dc85cc"; got != want {
		t.Errorf("hash of the chained intent = %s, want %s", got, want)
	}
	if enc := audit.CanonicalEncoding(7, &first); !bytes.Equal(h1, sha256Of(audit.GenesisHash(), enc)) {
		t.Error("ComputeHash is not SHA-256(prev || CanonicalEncoding)")
	}
}

func sha256Of(parts ...[]byte) []byte {
	h := sha256.New()
	for _, p := range parts {
		h.Write(p)
	}
	return h.Sum(nil)
}

// TestTrustCeilingKeepsV1Hashes: a row without a trust ceiling encodes as
// the first release did (v1), so every stored hash still verifies; a row
// with one is encoded v2, which no v1 row can collide with, and its
// ceiling is covered.
func TestTrustCeilingKeepsV1Hashes(t *testing.T) {
	r := audit.Record{Tenant: "acme", InvocationID: "inv-1", Phase: audit.PhaseOutcome,
		Approval: &audit.Approval{ChallengeID: "c", Approver: "carol", Channel: "mcp_elicitation"}}
	if enc := audit.CanonicalEncoding(1, &r); !bytes.HasPrefix(enc, []byte("mandate.audit.record.v1\x00")) {
		t.Fatalf("a row without a ceiling is not v1: %q", enc[:24])
	}
	r.Approval.TrustCeiling = "L3"
	v2 := audit.CanonicalEncoding(1, &r)
	if !bytes.HasPrefix(v2, []byte("mandate.audit.record.v2\x00")) {
		t.Fatalf("a row with a ceiling is not v2: %q", v2[:24])
	}
	r.Approval.TrustCeiling = "L2"
	if bytes.Equal(v2, audit.CanonicalEncoding(1, &r)) {
		t.Fatal("the ceiling is not covered by the encoding")
	}
}
