package audittest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/services/audit"
)

// Run runs the conformance suite. newStore must return an empty store, independent of the
// stores returned by other calls; closing it is up to newStore (t.Cleanup).
func Run(t *testing.T, newStore func(t *testing.T) audit.Store) {
	s := &suite{newStore: newStore}
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"Chain", s.testChain},
		{"ChainUnbatched", s.testChainUnbatched},
		{"Validation", s.testValidation},
		{"RoundTrip", s.testRoundTrip},
		{"IdempotentRetry", s.testIdempotentRetry},
		{"DedupeInsideBatch", s.testDedupeInsideBatch},
		{"ConcurrentSameKey", s.testConcurrentSameKey},
		{"ConcurrentAppends", s.testConcurrentAppends},
		{"QueryFilters", s.testQueryFilters},
		{"QueryInvalid", s.testQueryInvalid},
		{"Pagination", s.testPagination},
		{"PaginationStableUnderAppends", s.testPaginationStable},
		{"Get", s.testGet},
		{"CheckRows", s.testCheckRows},
		{"DecisionRows", s.testDecisionRows},
		{"TenantIsolation", s.testTenantIsolation},
		{"Watch", s.testWatch},
		{"Reconcile", s.testReconcile},
		{"UnresolvedUnknowns", s.testUnresolvedUnknowns},
		{"Reconciler", s.testReconciler},
		{"WriterClose", s.testWriterClose},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // every test has its own store
			tt.fn(t)
		})
	}
}

type suite struct {
	newStore func(t *testing.T) audit.Store
}

// Base is the time of the records the suite writes: fixed, so reconciliation thresholds and
// time filters are exact.
var Base = time.Date(2026, 1, 5, 9, 0, 0, 0, time.UTC)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newWriter(t *testing.T, st audit.Store, opts audit.WriterOptions) *audit.Writer {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	w := audit.NewWriter(st, opts)
	t.Cleanup(func() { _ = w.Close() })
	return w
}

// Rec returns a valid record; tests adjust the fields they care about.
func Rec(tenant, inv string, phase audit.Phase) audit.Record {
	r := audit.Record{
		InvocationID:    inv,
		Phase:           phase,
		Time:            Base,
		Tenant:          tenant,
		Channel:         audit.ChannelMCP,
		Command:         "ticket.refund",
		Risk:            audit.RiskL3,
		SideEffects:     []string{"payment-gateway", "ledger"},
		Idempotent:      true,
		Subject:         "ticket/42",
		UserID:          "alice",
		ActorKind:       audit.ActorAgent,
		AgentID:         "support-bot",
		Model:           "claude",
		ModelVersion:    "4.5",
		ConversationID:  "conv-1",
		MCPSessionID:    "sess-1",
		Arguments:       []byte(`{"ticket_id": "42", "amount": 1250, "cardholder_reference": "[withheld]"}`),
		ArgumentsDigest: "sha256:abc",
		TraceID:         "4bf92f3577b34da6a3ce929d0e0e4736",
		ManifestDigest:  "sha256:manifest",
	}
	if phase == audit.PhaseOutcome {
		r.Outcome = audit.OutcomeExecuted
		r.ResultDigest = "sha256:res"
		r.Duration = 1500 * time.Millisecond
		r.Approval = &audit.Approval{ChallengeID: "ch-1", Approver: "alice", Channel: "mcp_elicitation", DecidedAt: Base.Add(-time.Second), TrustCeiling: "L3"}
	}
	return r
}

func mustAppend(t *testing.T, w *audit.Writer, recs ...audit.Record) []audit.Stored {
	t.Helper()
	out, err := w.Append(testCtx(t), recs...)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	return out
}

func mustVerify(t *testing.T, st audit.Store, tenant string, rows int64) audit.Report {
	t.Helper()
	rep, err := st.Verify(testCtx(t), tenant)
	if err != nil {
		t.Fatalf("Verify(%s): %v", tenant, err)
	}
	if !rep.OK || rep.Rows != rows || rep.Head.Seq != rows {
		t.Fatalf("Verify(%s) = ok=%v rows=%d head=%d break=%+v; want ok with %d rows", tenant, rep.OK, rep.Rows, rep.Head.Seq, rep.Break, rows)
	}
	return rep
}

// allRows returns every row of the tenant, oldest first, by paging through Query.
func allRows(t *testing.T, st audit.Store, f audit.Filter) []audit.Stored {
	t.Helper()
	var out []audit.Stored
	for {
		p, err := st.Query(testCtx(t), f)
		if err != nil {
			t.Fatalf("Query: %v", err)
		}
		out = append(out, p.Records...)
		if p.NextPageToken == "" {
			break
		}
		f.PageToken = p.NextPageToken
	}
	slices.Reverse(out)
	return out
}

func seqs(rows []audit.Stored) []int64 {
	out := make([]int64, len(rows))
	for i := range rows {
		out[i] = rows[i].Seq
	}
	return out
}

func (s *suite) testChain(t *testing.T)          { s.chain(t, audit.WriterOptions{}) }
func (s *suite) testChainUnbatched(t *testing.T) { s.chain(t, audit.WriterOptions{Unbatched: true}) }

func (s *suite) chain(t *testing.T, opts audit.WriterOptions) {
	st := s.newStore(t)
	w := newWriter(t, st, opts)
	var stored []audit.Stored
	for i := range 5 {
		stored = append(stored, mustAppend(t, w, Rec("acme", fmt.Sprintf("inv-%d", i), audit.PhaseIntent))...)
	}
	// Several records in one Append are chained in the order given.
	stored = append(stored, mustAppend(t, w,
		Rec("acme", "inv-0", audit.PhaseOutcome), Rec("acme", "inv-1", audit.PhaseOutcome), Rec("acme", "inv-2", audit.PhaseOutcome))...)
	prev := audit.GenesisHash()
	for i, r := range stored {
		if r.Seq != int64(i+1) {
			t.Fatalf("row %d has seq %d", i, r.Seq)
		}
		if !bytes.Equal(r.PrevHash, prev) {
			t.Fatalf("row %d: prev_hash is not the previous row's hash", r.Seq)
		}
		if want := audit.ComputeHash(r.PrevHash, r.Seq, &r.Record); !bytes.Equal(r.Hash, want) {
			t.Fatalf("row %d: hash is not SHA-256(prev || canonical record)", r.Seq)
		}
		prev = r.Hash
	}
	rep := mustVerify(t, st, "acme", 8)
	if !bytes.Equal(rep.Head.Hash, prev) {
		t.Fatal("head hash is not the last row's hash")
	}
	// What Query returns is what Append returned.
	got := allRows(t, st, audit.Filter{Tenant: "acme"})
	if len(got) != len(stored) {
		t.Fatalf("query returned %d rows, want %d", len(got), len(stored))
	}
	for i := range got {
		assertSameRow(t, got[i], stored[i])
	}
}

func assertSameRow(t *testing.T, got, want audit.Stored) {
	t.Helper()
	if got.Seq != want.Seq || !bytes.Equal(got.Hash, want.Hash) || !bytes.Equal(got.PrevHash, want.PrevHash) {
		t.Fatalf("row seq %d: got seq %d hash %x, want hash %x", want.Seq, got.Seq, got.Hash, want.Hash)
	}
	// Every field survives the round trip: recomputing the hash from what was read back
	// must give the stored hash.
	if h := audit.ComputeHash(got.PrevHash, got.Seq, &got.Record); !bytes.Equal(h, got.Hash) {
		t.Fatalf("row seq %d read back does not hash to its hash: %+v", got.Seq, got.Record)
	}
}

func (s *suite) testValidation(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	long := string(bytes.Repeat([]byte("x"), audit.MaxFieldLen+1))
	tests := []struct {
		name  string
		edit  func(r *audit.Record)
		field string
	}{
		{"missing tenant", func(r *audit.Record) { r.Tenant = "" }, "tenant"},
		{"missing invocation id", func(r *audit.Record) { r.InvocationID = "" }, "invocation_id"},
		{"missing command", func(r *audit.Record) { r.Command = "" }, "command"},
		{"missing phase", func(r *audit.Record) { r.Phase = "" }, "phase"},
		{"unknown phase", func(r *audit.Record) { r.Phase = "during" }, "phase"},
		{"intent with an outcome", func(r *audit.Record) { r.Outcome = audit.OutcomeExecuted }, "outcome"},
		{"unknown channel", func(r *audit.Record) { r.Channel = "smtp" }, "channel"},
		{"unknown risk", func(r *audit.Record) { r.Risk = "L9" }, "risk"},
		{"unknown actor kind", func(r *audit.Record) { r.ActorKind = "robot" }, "actor_kind"},
		{"tenant too long", func(r *audit.Record) { r.Tenant = long }, "tenant"},
		{"message too long", func(r *audit.Record) { r.Message = string(bytes.Repeat([]byte("m"), audit.MaxMessageLen+1)) }, "message"},
		{"invalid utf-8", func(r *audit.Record) { r.Subject = "\xff\xfe" }, "subject"},
		{"nul byte", func(r *audit.Record) { r.UserID = "al\x00ice" }, "user_id"},
		{"arguments not json", func(r *audit.Record) { r.Arguments = []byte(`{"a":`) }, "arguments"},
		{"arguments too large", func(r *audit.Record) {
			r.Arguments = []byte(`"` + string(bytes.Repeat([]byte("a"), audit.MaxArgumentsLen)) + `"`)
		}, "arguments"},
		{"too many side effects", func(r *audit.Record) {
			r.SideEffects = nil
			for i := range audit.MaxSideEffects + 1 {
				r.SideEffects = append(r.SideEffects, fmt.Sprintf("se%d", i))
			}
		}, "side_effects"},
		{"empty side effect", func(r *audit.Record) { r.SideEffects = []string{""} }, "side_effects"},
		{"negative duration", func(r *audit.Record) { r.Duration = -1 }, "duration"},
		{"time before 1970", func(r *audit.Record) { r.Time = time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC) }, "time"},
		{"approval without approver", func(r *audit.Record) { r.Approval = &audit.Approval{ChallengeID: "c"} }, "approval"},
		{"approval with a trust ceiling that is no risk", func(r *audit.Record) {
			r.Approval = &audit.Approval{ChallengeID: "c", Approver: "a", Channel: "mcp_elicitation", TrustCeiling: "L9"}
		}, "approval.trust_ceiling"},
		{"outcome missing", func(r *audit.Record) { r.Phase, r.Outcome = audit.PhaseOutcome, "" }, "outcome"},
		{"refused without code", func(r *audit.Record) {
			r.Phase, r.Outcome, r.Stage = audit.PhaseOutcome, audit.OutcomeRefused, failure.StagePermission
		}, "code"},
		{"outcome pending", func(r *audit.Record) { r.Phase, r.Outcome = audit.PhaseOutcome, audit.OutcomePending }, "outcome"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Rec("acme", "inv-"+tt.name, audit.PhaseIntent)
			tt.edit(&r)
			_, err := w.Append(testCtx(t), r)
			if !errors.Is(err, audit.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			var ve *audit.ValidationError
			if !errors.As(err, &ve) || ve.Field != tt.field {
				t.Fatalf("err = %v, want a ValidationError on field %q", err, tt.field)
			}
		})
	}
	// One bad record fails the whole Append: the good one beside it is not written either.
	bad := Rec("acme", "bad", audit.PhaseIntent)
	bad.Command = ""
	if _, err := w.Append(testCtx(t), Rec("acme", "good", audit.PhaseIntent), bad); !errors.Is(err, audit.ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	rep, err := st.Verify(testCtx(t), "acme")
	if err != nil || rep.Rows != 0 {
		t.Fatalf("after refused appends: rows=%d err=%v, want nothing written", rep.Rows, err)
	}
}

func (s *suite) testRoundTrip(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	ctx := testCtx(t)
	full := Rec("acme", "full", audit.PhaseOutcome)
	full.Time = time.Date(2026, 2, 3, 4, 5, 6, 789123456, time.FixedZone("CET", 3600))
	full.SideEffects = []string{"ledger", "email", "ledger"}
	full.Reversible = true
	full.Message = "naïve ✓ message with \"quotes\" and \\ backslashes"
	full.Arguments = []byte("{ \"b\" : [1, 2.50, \"x\"],\n \"a\": {\"é\": null, \"\\u0041\": true} }")
	empty := audit.Record{Tenant: "acme", InvocationID: "minimal", Phase: audit.PhaseOutcome, Channel: audit.ChannelREST,
		Command: "ticket.search", Outcome: audit.OutcomeRefused, Stage: failure.StageAuthenticate, Code: failure.CodeAuthenticationInvalidToken}
	stored := mustAppend(t, w, full, empty)

	if got := stored[0].Time; !got.Equal(time.Date(2026, 2, 3, 3, 5, 6, 789123000, time.UTC)) || got.Location() != time.UTC {
		t.Errorf("time = %v, want UTC truncated to the microsecond", got)
	}
	if got := stored[0].SideEffects; !slices.Equal(got, []string{"email", "ledger"}) {
		t.Errorf("side effects = %v, want sorted and de-duplicated", got)
	}
	if got := string(stored[0].Arguments); got != `{"b":[1,2.50,"x"],"a":{"é":null,"\u0041":true}}` {
		t.Errorf("arguments = %s, want compacted with key order and escapes kept", got)
	}
	for _, inv := range []string{"full", "minimal"} {
		rows, err := st.Get(ctx, "acme", inv)
		if err != nil || len(rows) != 1 {
			t.Fatalf("Get(%s) = %d rows, %v", inv, len(rows), err)
		}
		want := stored[0]
		if inv == "minimal" {
			want = stored[1]
		}
		assertSameRow(t, rows[0], want)
		if !equalRecords(rows[0].Record, want.Record) {
			t.Fatalf("Get(%s) = %+v\nwant %+v", inv, rows[0].Record, want.Record)
		}
	}
	if a := stored[1].Approval; a != nil || stored[1].Approved() {
		t.Errorf("minimal record has approval %+v", a)
	}
	mustVerify(t, st, "acme", 2)
}

func equalRecords(a, b audit.Record) bool {
	return bytes.Equal(audit.CanonicalEncoding(1, &a), audit.CanonicalEncoding(1, &b)) && a.Time.Location() == b.Time.Location()
}

func (s *suite) testIdempotentRetry(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	first := mustAppend(t, w, Rec("acme", "inv-1", audit.PhaseIntent))[0]
	retry := Rec("acme", "inv-1", audit.PhaseIntent)
	retry.Message = "a retried append with different content"
	again := mustAppend(t, w, retry)[0]
	if again.Seq != first.Seq || !bytes.Equal(again.Hash, first.Hash) || again.Message != "" {
		t.Fatalf("retry returned seq %d message %q, want the stored row (seq %d)", again.Seq, again.Message, first.Seq)
	}
	// The chain did not move: the next new row is seq 2.
	next := mustAppend(t, w, Rec("acme", "inv-1", audit.PhaseOutcome))[0]
	if next.Seq != 2 {
		t.Fatalf("next row has seq %d, want 2", next.Seq)
	}
	// A retry of several records at once, mixing stored and new ones.
	mixed := mustAppend(t, w, Rec("acme", "inv-1", audit.PhaseOutcome), Rec("acme", "inv-2", audit.PhaseIntent), Rec("acme", "inv-1", audit.PhaseIntent))
	if got := seqs(mixed); !slices.Equal(got, []int64{2, 3, 1}) {
		t.Fatalf("mixed retry seqs = %v, want [2 3 1]", got)
	}
	mustVerify(t, st, "acme", 3)
}

func (s *suite) testDedupeInsideBatch(t *testing.T) {
	st := s.newStore(t)
	ctx := testCtx(t)
	recs := []audit.Record{
		Rec("acme", "a", audit.PhaseIntent),
		Rec("acme", "b", audit.PhaseIntent),
		Rec("acme", "a", audit.PhaseIntent),
		Rec("globex", "a", audit.PhaseIntent), // same invocation id, other tenant: another row
		Rec("acme", "a", audit.PhaseOutcome),
		Rec("acme", "b", audit.PhaseIntent),
	}
	for i := range recs {
		recs[i] = recs[i].Normalize(Base)
	}
	out, err := st.AppendBatch(ctx, recs)
	if err != nil {
		t.Fatal(err)
	}
	if got := seqs(out); !slices.Equal(got, []int64{1, 2, 1, 1, 3, 2}) {
		t.Fatalf("seqs = %v, want [1 2 1 1 3 2]", got)
	}
	if out[3].Tenant != "globex" || out[0].Tenant != "acme" {
		t.Fatal("rows of different tenants were merged")
	}
	mustVerify(t, st, "acme", 3)
	mustVerify(t, st, "globex", 1)
}

func (s *suite) testConcurrentSameKey(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts audit.WriterOptions
	}{
		{"batched", audit.WriterOptions{}},
		{"unbatched", audit.WriterOptions{Unbatched: true}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			st := s.newStore(t)
			w := newWriter(t, st, mode.opts)
			mustAppend(t, w, Rec("acme", "before", audit.PhaseIntent))
			const n = 64
			results := make([]audit.Stored, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					r := Rec("acme", "same", audit.PhaseOutcome)
					r.Message = fmt.Sprintf("attempt %d", i)
					<-start
					out, err := w.Append(testCtx(t), r)
					errs[i] = err
					if err == nil {
						results[i] = out[0]
					}
				})
			}
			close(start)
			wg.Wait()
			for i := range n {
				if errs[i] != nil {
					t.Fatalf("append %d: %v", i, errs[i])
				}
				if results[i].Seq != 2 || !bytes.Equal(results[i].Hash, results[0].Hash) || results[i].Message != results[0].Message {
					t.Fatalf("append %d got seq %d (%q), append 0 got seq %d (%q)", i, results[i].Seq, results[i].Message, results[0].Seq, results[0].Message)
				}
			}
			rows, err := st.Get(testCtx(t), "acme", "same")
			if err != nil || len(rows) != 1 {
				t.Fatalf("Get = %d rows, %v; want exactly one", len(rows), err)
			}
			mustVerify(t, st, "acme", 2)
		})
	}
}

func (s *suite) testConcurrentAppends(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{MaxBatch: 16})
	const writers, each = 32, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for g := range writers {
		wg.Go(func() {
			tenant := []string{"acme", "globex"}[g%2]
			for i := range each {
				inv := fmt.Sprintf("g%d-%d", g, i)
				if _, err := w.Append(testCtx(t), Rec(tenant, inv, audit.PhaseIntent), Rec(tenant, inv, audit.PhaseOutcome)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, tenant := range []string{"acme", "globex"} {
		mustVerify(t, st, tenant, writers/2*each*2)
		rows := allRows(t, st, audit.Filter{Tenant: tenant, PageSize: audit.MaxPageSize})
		for i, r := range rows {
			if r.Seq != int64(i+1) {
				t.Fatalf("%s: row %d has seq %d: the sequence has a gap", tenant, i, r.Seq)
			}
		}
		// Both records of one Append are adjacent: one Append is one atomic unit.
		for i := 0; i < len(rows); i += 2 {
			if rows[i].InvocationID != rows[i+1].InvocationID {
				t.Fatalf("%s: seq %d and %d belong to different appends", tenant, rows[i].Seq, rows[i+1].Seq)
			}
		}
	}
	if stats := w.Stats(); stats.Batches >= stats.Appends {
		t.Logf("note: %d appends took %d batches (no batching happened)", stats.Appends, stats.Batches)
	}
}

// dataset appends a varied trail for acme (with globex rows interleaved) and returns acme's
// rows in seq order.
func dataset(t *testing.T, w *audit.Writer) []audit.Stored {
	t.Helper()
	kinds := []audit.ActorKind{audit.ActorUser, audit.ActorAgent, audit.ActorService}
	outcomes := []audit.Outcome{audit.OutcomeExecuted, audit.OutcomeRefused, audit.OutcomeFailed}
	var acme []audit.Stored
	for i := range 24 {
		inv := fmt.Sprintf("inv-%02d", i)
		kind := kinds[i%3]
		risk := audit.Risk(fmt.Sprintf("L%d", i%5))
		var se []string
		switch i % 4 {
		case 0, 3:
			se = []string{"ledger", "payment-gateway"}
		case 1:
			se = []string{"email"}
		}
		cmd := "ticket.search"
		if i%5 >= 3 {
			cmd = "ticket.refund"
		}
		base := audit.Record{Tenant: "acme", InvocationID: inv, Channel: audit.ChannelGRPC, Command: cmd, Risk: risk,
			SideEffects: se, UserID: "alice", ActorKind: kind, ConversationID: fmt.Sprintf("conv-%d", i%4), TraceID: "t" + inv}
		if kind == audit.ActorAgent {
			base.AgentID = []string{"bot-a", "bot-b"}[i%2]
			base.Model = []string{"gpt", "claude"}[(i/3)%2]
		}
		intent := base
		intent.Phase = audit.PhaseIntent
		intent.Time = Base.Add(time.Duration(2*i) * time.Minute)
		outcome := base
		outcome.Phase = audit.PhaseOutcome
		outcome.Time = Base.Add(time.Duration(2*i+1) * time.Minute)
		outcome.Outcome = outcomes[i%3]
		if outcome.Outcome != audit.OutcomeExecuted {
			outcome.Stage, outcome.Code = "dispatch", failure.CodeHandlerFailed
			if outcome.Outcome == audit.OutcomeRefused {
				outcome.Stage, outcome.Code = failure.StageSoD, failure.CodeSoDConflict
			}
		}
		if risk >= audit.RiskL3 {
			outcome.Approval = &audit.Approval{ChallengeID: "ch-" + inv, Approver: []string{"carol", "dave"}[i%2], Channel: "approval_page"}
		}
		recs := []audit.Record{intent, outcome}
		if i%7 == 3 { // some calls are refused before dispatch: outcome only
			recs = recs[1:]
		}
		acme = append(acme, mustAppend(t, w, recs...)...)
		other := Rec("globex", inv, audit.PhaseIntent)
		other.Time = intent.Time
		mustAppend(t, w, other)
	}
	return acme
}

func (s *suite) testQueryFilters(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	rows := dataset(t, w)
	yes, no := true, false
	from, to := Base.Add(10*time.Minute), Base.Add(30*time.Minute)
	tests := []struct {
		name string
		f    audit.Filter
		want func(r *audit.Stored) bool
	}{
		{"tenant only", audit.Filter{}, func(*audit.Stored) bool { return true }},
		{"from", audit.Filter{From: from}, func(r *audit.Stored) bool { return !r.Time.Before(from) }},
		{"to", audit.Filter{To: to}, func(r *audit.Stored) bool { return r.Time.Before(to) }},
		{"from and to", audit.Filter{From: from, To: to}, func(r *audit.Stored) bool { return !r.Time.Before(from) && r.Time.Before(to) }},
		{"actor kind agent", audit.Filter{ActorKinds: []audit.ActorKind{audit.ActorAgent}}, func(r *audit.Stored) bool { return r.ActorKind == audit.ActorAgent }},
		{"actor kinds user or service", audit.Filter{ActorKinds: []audit.ActorKind{audit.ActorService, audit.ActorUser}}, func(r *audit.Stored) bool { return r.ActorKind != audit.ActorAgent }},
		{"agent id", audit.Filter{AgentID: "bot-a"}, func(r *audit.Stored) bool { return r.AgentID == "bot-a" }},
		{"model", audit.Filter{Model: "claude"}, func(r *audit.Stored) bool { return r.Model == "claude" }},
		{"risks L3 L4", audit.Filter{Risks: []audit.Risk{audit.RiskL4, audit.RiskL3}}, func(r *audit.Stored) bool { return r.Risk == audit.RiskL3 || r.Risk == audit.RiskL4 }},
		{"side effect", audit.Filter{SideEffect: "ledger"}, func(r *audit.Stored) bool { return slices.Contains(r.SideEffects, "ledger") }},
		{"command", audit.Filter{Command: "ticket.refund"}, func(r *audit.Stored) bool { return r.Command == "ticket.refund" }},
		{"outcome refused", audit.Filter{Outcomes: []audit.Outcome{audit.OutcomeRefused}}, func(r *audit.Stored) bool { return r.Outcome == audit.OutcomeRefused }},
		{"outcome pending", audit.Filter{Outcomes: []audit.Outcome{audit.OutcomePending}}, func(r *audit.Stored) bool { return r.Phase == audit.PhaseIntent }},
		{"stage", audit.Filter{Stage: failure.StageSoD}, func(r *audit.Stored) bool { return r.Stage == failure.StageSoD }},
		{"approved", audit.Filter{Approved: &yes}, func(r *audit.Stored) bool { return r.Approval != nil }},
		{"not approved", audit.Filter{Approved: &no}, func(r *audit.Stored) bool { return r.Approval == nil }},
		{"approver", audit.Filter{Approver: "dave"}, func(r *audit.Stored) bool { return r.Approval != nil && r.Approval.Approver == "dave" }},
		{"conversation", audit.Filter{ConversationID: "conv-2"}, func(r *audit.Stored) bool { return r.ConversationID == "conv-2" }},
		{"phase intent", audit.Filter{Phase: audit.PhaseIntent}, func(r *audit.Stored) bool { return r.Phase == audit.PhaseIntent }},
		{"phase outcome", audit.Filter{Phase: audit.PhaseOutcome}, func(r *audit.Stored) bool { return r.Phase == audit.PhaseOutcome }},
		{"compliance question", audit.Filter{ActorKinds: []audit.ActorKind{audit.ActorAgent}, Risks: []audit.Risk{audit.RiskL3, audit.RiskL4},
			SideEffect: "ledger", Phase: audit.PhaseOutcome, From: Base, To: Base.Add(48 * time.Minute)},
			func(r *audit.Stored) bool {
				return r.ActorKind == audit.ActorAgent && (r.Risk == audit.RiskL3 || r.Risk == audit.RiskL4) &&
					slices.Contains(r.SideEffects, "ledger") && r.Phase == audit.PhaseOutcome && r.Time.Before(Base.Add(48*time.Minute))
			}},
		{"nothing matches", audit.Filter{Command: "no.such.command"}, func(*audit.Stored) bool { return false }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want []int64
			for i := len(rows) - 1; i >= 0; i-- {
				if tt.want(&rows[i]) {
					want = append(want, rows[i].Seq)
				}
			}
			if tt.name != "nothing matches" && len(want) == 0 {
				t.Fatal("the case selects no rows of the dataset; it would prove nothing")
			}
			f := tt.f
			f.Tenant = "acme"
			f.PageSize = audit.MaxPageSize
			p, err := st.Query(testCtx(t), f)
			if err != nil {
				t.Fatal(err)
			}
			if got := seqs(p.Records); !slices.Equal(got, want) {
				t.Fatalf("seqs = %v\nwant   %v", got, want)
			}
			for _, r := range p.Records {
				if r.Tenant != "acme" {
					t.Fatalf("row of tenant %q returned", r.Tenant)
				}
			}
			// Paging through the same filter yields the same rows.
			f.PageSize = 4
			paged := allRows(t, st, f)
			slices.Reverse(paged)
			if got := seqs(paged); !slices.Equal(got, want) {
				t.Fatalf("paged seqs = %v\nwant         %v", got, want)
			}
		})
	}
}

func (s *suite) testQueryInvalid(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	dataset(t, w)
	p, err := st.Query(testCtx(t), audit.Filter{Tenant: "acme", PageSize: 2})
	if err != nil || p.NextPageToken == "" {
		t.Fatalf("first page: %v, token %q", err, p.NextPageToken)
	}
	tok := p.NextPageToken
	tests := []struct {
		name string
		f    audit.Filter
		want error
	}{
		{"no tenant", audit.Filter{}, audit.ErrInvalid},
		{"bad risk", audit.Filter{Tenant: "acme", Risks: []audit.Risk{"high"}}, audit.ErrInvalid},
		{"bad actor kind", audit.Filter{Tenant: "acme", ActorKinds: []audit.ActorKind{"robot"}}, audit.ErrInvalid},
		{"bad outcome", audit.Filter{Tenant: "acme", Outcomes: []audit.Outcome{"maybe"}}, audit.ErrInvalid},
		{"bad phase", audit.Filter{Tenant: "acme", Phase: "during"}, audit.ErrInvalid},
		{"negative page size", audit.Filter{Tenant: "acme", PageSize: -1}, audit.ErrInvalid},
		{"from after to", audit.Filter{Tenant: "acme", From: Base.Add(time.Hour), To: Base}, audit.ErrInvalid},
		{"malformed token", audit.Filter{Tenant: "acme", PageToken: "not-a-token"}, audit.ErrInvalidPageToken},
		{"token replayed with another filter", audit.Filter{Tenant: "acme", Phase: audit.PhaseIntent, PageToken: tok}, audit.ErrInvalidPageToken},
		{"token replayed for another tenant", audit.Filter{Tenant: "globex", PageToken: tok}, audit.ErrInvalidPageToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := st.Query(testCtx(t), tt.f)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	// PageSize may change between pages: it is not part of what the token is bound to.
	if _, err := st.Query(testCtx(t), audit.Filter{Tenant: "acme", PageSize: 7, PageToken: tok}); err != nil {
		t.Fatalf("same filter, other page size: %v", err)
	}
}

func (s *suite) testPagination(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	var recs []audit.Record
	for i := range 1030 {
		recs = append(recs, Rec("acme", fmt.Sprintf("inv-%04d", i), audit.PhaseIntent))
	}
	mustAppend(t, w, recs[:1000]...)
	mustAppend(t, w, recs[1000:]...)
	tests := []struct {
		name      string
		pageSize  int
		wantSizes []int
	}{
		{"default page size is 50", 0, append(repeat(50, 20), 30)},
		{"page size 1000", 1000, []int{1000, 30}},
		{"page size above the maximum is capped", 5000, []int{1000, 30}},
		{"exact multiple", 515, []int{515, 515}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := audit.Filter{Tenant: "acme", PageSize: tt.pageSize}
			var sizes []int
			next := int64(1030)
			for {
				p, err := st.Query(testCtx(t), f)
				if err != nil {
					t.Fatal(err)
				}
				sizes = append(sizes, len(p.Records))
				for _, r := range p.Records {
					if r.Seq != next {
						t.Fatalf("got seq %d, want %d (newest first, no gaps)", r.Seq, next)
					}
					next--
				}
				if p.NextPageToken == "" {
					break
				}
				f.PageToken = p.NextPageToken
			}
			if !slices.Equal(sizes, tt.wantSizes) {
				t.Fatalf("page sizes = %v, want %v", sizes, tt.wantSizes)
			}
			if next != 0 {
				t.Fatalf("paging stopped before seq 1 (at %d)", next)
			}
		})
	}
	// An empty tenant has an empty first page and no token.
	p, err := st.Query(testCtx(t), audit.Filter{Tenant: "nobody"})
	if err != nil || len(p.Records) != 0 || p.NextPageToken != "" {
		t.Fatalf("empty tenant: %d rows, token %q, %v", len(p.Records), p.NextPageToken, err)
	}
}

func repeat(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func (s *suite) testPaginationStable(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	var recs []audit.Record
	for i := range 300 {
		recs = append(recs, Rec("acme", fmt.Sprintf("old-%d", i), audit.PhaseIntent))
	}
	mustAppend(t, w, recs...)

	ctx, cancel := context.WithCancel(testCtx(t))
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			if _, err := w.Append(ctx, Rec("acme", fmt.Sprintf("new-%d", i), audit.PhaseIntent)); err != nil && ctx.Err() == nil {
				t.Errorf("concurrent append: %v", err)
				return
			}
		}
	})
	f := audit.Filter{Tenant: "acme", PageSize: 7}
	var got []int64
	for {
		p, err := st.Query(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, seqs(p.Records)...)
		if p.NextPageToken == "" {
			break
		}
		f.PageToken = p.NextPageToken
		time.Sleep(time.Millisecond) // let appends land between pages
	}
	cancel()
	wg.Wait()
	if len(got) < 300 {
		t.Fatalf("paged %d rows, want at least the 300 stored before paging began", len(got))
	}
	// Newest first from wherever the first page started, down to 1, each row exactly once.
	for i, seq := range got {
		if want := got[0] - int64(i); seq != want {
			t.Fatalf("position %d: seq %d, want %d (a row was skipped or repeated)", i, seq, want)
		}
	}
	if got[len(got)-1] != 1 {
		t.Fatalf("last seq %d, want 1", got[len(got)-1])
	}
}

func (s *suite) testGet(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	in := mustAppend(t, w, Rec("acme", "inv-1", audit.PhaseIntent))
	mustAppend(t, w, Rec("acme", "inv-2", audit.PhaseIntent))
	out := mustAppend(t, w, Rec("acme", "inv-1", audit.PhaseOutcome))
	refused := Rec("acme", "inv-3", audit.PhaseOutcome)
	refused.Outcome, refused.Stage, refused.Code = audit.OutcomeRefused, failure.StagePermission, failure.CodeAuthorizationPermissionDenied
	mustAppend(t, w, refused)
	tests := []struct {
		name    string
		tenant  string
		inv     string
		want    []int64
		wantErr error
	}{
		{"intent and outcome in order", "acme", "inv-1", []int64{in[0].Seq, out[0].Seq}, nil},
		{"intent only", "acme", "inv-2", []int64{2}, nil},
		{"refused before dispatch: outcome only", "acme", "inv-3", []int64{4}, nil},
		{"unknown invocation", "acme", "inv-9", nil, audit.ErrNotFound},
		{"other tenant", "globex", "inv-1", nil, audit.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := st.Get(testCtx(t), tt.tenant, tt.inv)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if got := seqs(rows); !slices.Equal(got, tt.want) && (len(got) != 0 || len(tt.want) != 0) {
				t.Fatalf("seqs = %v, want %v", got, tt.want)
			}
		})
	}
}

func (s *suite) testTenantIsolation(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	ctx := testCtx(t)
	// The same invocation id in two tenants: two independent rows, two chains.
	a := mustAppend(t, w, Rec("acme", "shared-id", audit.PhaseIntent), Rec("acme", "acme-only", audit.PhaseIntent))
	b := mustAppend(t, w, Rec("globex", "shared-id", audit.PhaseIntent))
	if a[0].Seq != 1 || b[0].Seq != 1 || bytes.Equal(a[0].Hash, b[0].Hash) {
		t.Fatalf("acme seq %d, globex seq %d: the tenants share a sequence or a chain", a[0].Seq, b[0].Seq)
	}
	tests := []struct {
		name string
		f    audit.Filter
	}{
		{"everything", audit.Filter{Tenant: "globex"}},
		{"by acme's agent", audit.Filter{Tenant: "globex", AgentID: "support-bot", Command: "ticket.refund"}},
		{"by conversation", audit.Filter{Tenant: "globex", ConversationID: "conv-1"}},
	}
	for _, tt := range tests {
		t.Run("query "+tt.name, func(t *testing.T) {
			p, err := st.Query(ctx, tt.f)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range p.Records {
				if r.Tenant != "globex" {
					t.Fatalf("globex's query returned a row of %q (%s)", r.Tenant, r.InvocationID)
				}
			}
			if len(p.Records) != 1 {
				t.Fatalf("globex's query returned %d rows, want its single row", len(p.Records))
			}
		})
	}
	t.Run("get", func(t *testing.T) {
		if _, err := st.Get(ctx, "globex", "acme-only"); !errors.Is(err, audit.ErrNotFound) {
			t.Fatalf("globex read acme's invocation: %v", err)
		}
		rows, err := st.Get(ctx, "globex", "shared-id")
		if err != nil || len(rows) != 1 || rows[0].Tenant != "globex" {
			t.Fatalf("Get(globex, shared-id) = %+v, %v", rows, err)
		}
	})
	t.Run("verify", func(t *testing.T) {
		mustVerify(t, st, "globex", 1)
		mustVerify(t, st, "acme", 2)
		rep, err := st.Verify(ctx, "initech")
		if err != nil || !rep.OK || rep.Rows != 0 {
			t.Fatalf("Verify of an empty tenant = %+v, %v", rep, err)
		}
	})
	t.Run("watch", func(t *testing.T) {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch, err := st.Watch(wctx, "globex", 0)
		if err != nil {
			t.Fatal(err)
		}
		mustAppend(t, w, Rec("acme", "acme-later", audit.PhaseIntent), Rec("globex", "globex-later", audit.PhaseIntent))
		for _, want := range []string{"shared-id", "globex-later"} {
			select {
			case r := <-ch:
				if r.Tenant != "globex" || r.InvocationID != want {
					t.Fatalf("globex's watch got %s/%s, want globex/%s", r.Tenant, r.InvocationID, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("no row %s on the watch", want)
			}
		}
		select {
		case r := <-ch:
			t.Fatalf("globex's watch got an extra row %s/%s", r.Tenant, r.InvocationID)
		case <-time.After(100 * time.Millisecond):
		}
	})
}

func (s *suite) testWatch(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	for i := range 3 {
		mustAppend(t, w, Rec("acme", fmt.Sprintf("inv-%d", i), audit.PhaseIntent))
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	ch, err := st.Watch(ctx, "acme", 1)
	if err != nil {
		t.Fatal(err)
	}
	receive := func(want int64) audit.Stored {
		t.Helper()
		select {
		case r, ok := <-ch:
			if !ok {
				t.Fatalf("watch closed before seq %d", want)
			}
			if r.Seq != want {
				t.Fatalf("watch delivered seq %d, want %d", r.Seq, want)
			}
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("no seq %d on the watch within 10s", want)
		}
		return audit.Stored{}
	}
	// The backlog after afterSeq first …
	receive(2)
	receive(3)
	// … then live rows, including many at once and from concurrent appends, in order.
	stored := mustAppend(t, w, Rec("acme", "live-1", audit.PhaseIntent))
	if r := receive(4); !bytes.Equal(r.Hash, stored[0].Hash) || r.InvocationID != "live-1" {
		t.Fatalf("watch delivered %+v, want the appended row", r)
	}
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			if _, err := w.Append(ctx, Rec("acme", fmt.Sprintf("burst-%d", i), audit.PhaseIntent)); err != nil {
				t.Errorf("burst append: %v", err)
			}
		})
	}
	for seq := int64(5); seq < 55; seq++ {
		receive(seq)
	}
	wg.Wait()
	// A second watcher from the start sees everything.
	ch2, err := st.Watch(ctx, "acme", 0)
	if err != nil {
		t.Fatal(err)
	}
	for want := int64(1); want <= 54; want++ {
		select {
		case r := <-ch2:
			if r.Seq != want {
				t.Fatalf("second watch delivered seq %d, want %d", r.Seq, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("second watch: no seq %d", want)
		}
	}
	cancel()
	for _, c := range []<-chan audit.Stored{ch, ch2} {
		select {
		case _, ok := <-c:
			for ok {
				_, ok = <-c
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the watch channel was not closed after its context ended")
		}
	}
	if _, err := st.Watch(testCtx(t), "", 0); !errors.Is(err, audit.ErrInvalid) {
		t.Fatalf("Watch without tenant: %v, want ErrInvalid", err)
	}
}

func (s *suite) testReconcile(t *testing.T) {
	st := s.newStore(t)
	now := Base.Add(time.Hour)
	w := newWriter(t, st, audit.WriterOptions{Now: func() time.Time { return now }})
	ctx := testCtx(t)
	at := func(r audit.Record, d time.Duration) audit.Record { r.Time = Base.Add(d); return r }
	mustAppend(t, w,
		at(Rec("acme", "done", audit.PhaseIntent), 0),
		at(Rec("acme", "done", audit.PhaseOutcome), time.Second),
		at(Rec("acme", "lost-1", audit.PhaseIntent), time.Minute),
		at(Rec("globex", "lost-2", audit.PhaseIntent), 2*time.Minute),
		at(Rec("acme", "recent", audit.PhaseIntent), 55*time.Minute),
	)
	tests := []struct {
		name      string
		olderThan time.Duration
		want      int
		unknown   map[string][]string // tenant → invocations with an unknown outcome afterwards
	}{
		{"only intents older than the threshold", 10 * time.Minute, 2, map[string][]string{"acme": {"lost-1"}, "globex": {"lost-2"}}},
		{"idempotent: nothing left to do", 10 * time.Minute, 0, map[string][]string{"acme": {"lost-1"}, "globex": {"lost-2"}}},
		{"a shorter threshold reaches the recent intent", time.Minute, 1, map[string][]string{"acme": {"recent", "lost-1"}, "globex": {"lost-2"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := w.Reconcile(ctx, tt.olderThan)
			if err != nil || n != tt.want {
				t.Fatalf("Reconcile = %d, %v; want %d", n, err, tt.want)
			}
			for tenant, invs := range tt.unknown {
				p, err := st.Query(ctx, audit.Filter{Tenant: tenant, Outcomes: []audit.Outcome{audit.OutcomeUnknown}})
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, r := range p.Records {
					got = append(got, r.InvocationID)
					if r.Phase != audit.PhaseOutcome || r.Stage != audit.StageAudit || r.Code != failure.CodeAuditOutcomeUnknown || r.Message == "" {
						t.Fatalf("reconciled row %+v", r.Record)
					}
					if r.Command != "ticket.refund" || r.AgentID != "support-bot" || r.TraceID == "" || !r.Time.Equal(now) {
						t.Fatalf("reconciled row lost the intent's context or time: %+v", r.Record)
					}
				}
				if !slices.Equal(got, invs) {
					t.Fatalf("%s: unknown outcomes for %v, want %v", tenant, got, invs)
				}
			}
		})
	}
	// A late real outcome does not add a second outcome row.
	late := mustAppend(t, w, at(Rec("acme", "lost-1", audit.PhaseOutcome), 2*time.Hour))[0]
	if late.Outcome != audit.OutcomeUnknown {
		t.Fatalf("late outcome stored as %s; want the reconciled unknown row returned", late.Outcome)
	}
	mustVerify(t, st, "acme", 6)
	mustVerify(t, st, "globex", 2)
	pending, err := st.PendingIntents(ctx, now.Add(time.Hour), 100)
	if err != nil || len(pending) != 0 {
		t.Fatalf("pending after reconciliation: %d, %v", len(pending), err)
	}
	if _, err := w.Reconcile(ctx, -time.Second); !errors.Is(err, audit.ErrInvalid) {
		t.Fatalf("negative threshold: %v", err)
	}
}

func (s *suite) testReconciler(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	old := Rec("acme", "old", audit.PhaseIntent)
	old.Time = time.Now().Add(-time.Hour)
	mustAppend(t, w, old)
	ctx, cancel := context.WithCancel(testCtx(t))
	done := make(chan error, 1)
	r := audit.NewReconciler(w, audit.ReconcilerOptions{Interval: 20 * time.Millisecond, OlderThan: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	go func() { done <- r.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rows, err := st.Get(ctx, "acme", "old")
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 2 {
			if rows[1].Outcome != audit.OutcomeUnknown {
				t.Fatalf("outcome %s", rows[1].Outcome)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reconciler did not reconcile within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A new stale intent is picked up at a later tick.
	old2 := Rec("acme", "old-2", audit.PhaseIntent)
	old2.Time = time.Now().Add(-time.Hour)
	mustAppend(t, w, old2)
	for {
		rows, err := st.Get(ctx, "acme", "old-2")
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reconciler did not pick up the second intent")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v after its context ended", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func (s *suite) testWriterClose(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts audit.WriterOptions
	}{
		{"batched", audit.WriterOptions{}},
		{"unbatched", audit.WriterOptions{Unbatched: true}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			st := s.newStore(t)
			opts := mode.opts
			opts.Logger = slog.New(slog.DiscardHandler)
			w := audit.NewWriter(st, opts)
			var wg sync.WaitGroup
			var mu sync.Mutex
			ok, closed := 0, 0
			start := make(chan struct{})
			for i := range 64 {
				wg.Go(func() {
					<-start
					_, err := w.Append(testCtx(t), Rec("acme", fmt.Sprintf("inv-%d", i), audit.PhaseIntent))
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						ok++
					case errors.Is(err, audit.ErrClosed):
						closed++
					default:
						t.Errorf("append %d: %v", i, err)
					}
				})
			}
			close(start)
			time.Sleep(time.Millisecond)
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if ok+closed != 64 {
				t.Fatalf("%d appends succeeded and %d were refused, want 64 in all", ok, closed)
			}
			// Every append that returned success is stored, and nothing else.
			mustVerify(t, st, "acme", int64(ok))
			if _, err := w.Append(testCtx(t), Rec("acme", "after", audit.PhaseIntent)); !errors.Is(err, audit.ErrClosed) {
				t.Fatalf("append after Close: %v, want ErrClosed", err)
			}
			if err := w.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
		})
	}
}

// testUnresolvedUnknowns: outcome rows that say unknown, older than the
// cut-off, of every tenant and oldest first, until a resolution row
// answers them; other outcomes never.
func (s *suite) testUnresolvedUnknowns(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	ctx := testCtx(t)
	unknown := func(tenant, inv string, d time.Duration) audit.Record {
		r := Rec(tenant, inv, audit.PhaseOutcome)
		r.Time, r.Outcome, r.Stage, r.Code, r.Approval = Base.Add(d), audit.OutcomeUnknown, "dispatch", failure.CodeHandlerUnavailable, nil
		return r
	}
	mustAppend(t, w,
		unknown("acme", "u-1", 0),
		unknown("globex", "u-2", time.Second),
		unknown("acme", "u-late", time.Hour),
		Rec("acme", "done", audit.PhaseOutcome),
	)
	list := func() string {
		t.Helper()
		rows, err := st.UnresolvedUnknowns(ctx, Base.Add(time.Minute), 10)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range rows {
			ids = append(ids, r.Tenant+"/"+r.InvocationID)
		}
		return strings.Join(ids, ",")
	}
	if got := list(); got != "acme/u-1,globex/u-2" {
		t.Fatalf("unresolved unknowns = %s", got)
	}
	res := Rec("acme", "u-1", audit.PhaseResolution)
	res.Time, res.Outcome, res.Stage, res.Code, res.Message = Base.Add(2*time.Second), audit.OutcomeFailed, audit.StageAudit, failure.CodeAuditResolvedNotExecuted, "the receipt says it never ran"
	mustAppend(t, w, res)
	if got := list(); got != "globex/u-2" {
		t.Fatalf("after u-1's resolution = %s", got)
	}
}

// testCheckRows: a check's row (phase check) takes a verdict as its
// outcome — allowed, or approval_required, refused or failed with stage
// and code — and nothing else; it is chained, read back by Get, and opens
// nothing for reconciliation to settle.
func (s *suite) testCheckRows(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	allowed := Rec("acme", "chk-1", audit.PhaseCheck)
	allowed.Outcome = audit.OutcomeAllowed
	approval := Rec("acme", "chk-2", audit.PhaseCheck)
	approval.Outcome, approval.Stage, approval.Code = audit.OutcomeApprovalRequired, failure.StageConfirmation, failure.CodeConfirmationRequired
	refused := Rec("acme", "chk-3", audit.PhaseCheck)
	refused.Outcome, refused.Stage, refused.Code = audit.OutcomeRefused, failure.StagePermission, failure.CodeAuthorizationPermissionDenied
	mustAppend(t, w, allowed, approval, refused)
	for _, want := range []audit.Record{allowed, approval, refused} {
		rows, err := st.Get(testCtx(t), "acme", want.InvocationID)
		if err != nil || len(rows) != 1 || rows[0].Phase != audit.PhaseCheck || rows[0].Outcome != want.Outcome || rows[0].Code != want.Code {
			t.Fatalf("Get(%s) = %+v, %v; want its one check row", want.InvocationID, rows, err)
		}
	}
	mustVerify(t, st, "acme", 3)
	for _, bad := range []func(r *audit.Record){
		func(r *audit.Record) { r.Outcome = audit.OutcomeExecuted },
		func(r *audit.Record) { r.Outcome = audit.OutcomePending },
		func(r *audit.Record) { r.Outcome = audit.OutcomeApprovalRequired },                 // without stage and code
		func(r *audit.Record) { r.Outcome, r.Stage, r.Code = audit.OutcomeRefused, "", "" }, // ditto
	} {
		r := Rec("acme", "chk-bad", audit.PhaseCheck)
		bad(&r)
		if _, err := w.Append(testCtx(t), r); !errors.Is(err, audit.ErrInvalid) {
			t.Fatalf("a check row with outcome %q stage %q: %v, want ErrInvalid", r.Outcome, r.Stage, err)
		}
	}
	// An allowed verdict on an outcome row is no outcome.
	r := Rec("acme", "out-allowed", audit.PhaseOutcome)
	r.Outcome = audit.OutcomeAllowed
	if _, err := w.Append(testCtx(t), r); !errors.Is(err, audit.ErrInvalid) {
		t.Fatalf("an outcome row with a check's verdict: %v, want ErrInvalid", err)
	}
}

// testDecisionRows: a decision attempt's row (phase decision) says
// approved or declined, or refused with stage and code; its command may be
// empty (the challenge named could not be read); it is chained with the
// tenant's other rows, read back by Get and kept by a phase filter, opens
// nothing for reconciliation, and never carries an approval.
func (s *suite) testDecisionRows(t *testing.T) {
	st := s.newStore(t)
	w := newWriter(t, st, audit.WriterOptions{})
	call := Rec("acme", "inv-1", audit.PhaseOutcome)
	approved := Rec("acme", "dec-1", audit.PhaseDecision)
	approved.Outcome, approved.Subject, approved.ActorKind, approved.AgentID = audit.OutcomeApproved, "chal-1", audit.ActorUser, ""
	declined := Rec("acme", "dec-2", audit.PhaseDecision)
	declined.Outcome = audit.OutcomeDeclined
	refused := Rec("acme", "dec-3", audit.PhaseDecision)
	refused.Outcome, refused.Stage, refused.Code = audit.OutcomeRefused, failure.StageConfirmation, failure.CodeConfirmationApproverNotAllowed
	unknown := Rec("acme", "dec-4", audit.PhaseDecision)
	unknown.Outcome, unknown.Stage, unknown.Code, unknown.Command, unknown.Risk = audit.OutcomeRefused, failure.StageConfirmation, failure.CodeConfirmationNotFound, "", ""
	mustAppend(t, w, call, approved, declined, refused, unknown)
	for _, want := range []audit.Record{approved, declined, refused, unknown} {
		rows, err := st.Get(testCtx(t), "acme", want.InvocationID)
		if err != nil || len(rows) != 1 || rows[0].Phase != audit.PhaseDecision || rows[0].Outcome != want.Outcome ||
			rows[0].Code != want.Code || rows[0].Command != want.Command || rows[0].Subject != want.Subject {
			t.Fatalf("Get(%s) = %+v, %v; want its one decision row", want.InvocationID, rows, err)
		}
	}
	page, err := st.Query(testCtx(t), audit.Filter{Tenant: "acme", Phase: audit.PhaseDecision})
	if err != nil || len(page.Records) != 4 {
		t.Fatalf("Query(phase decision) = %d rows, %v; want 4", len(page.Records), err)
	}
	mustVerify(t, st, "acme", 5)
	if open, err := st.PendingIntents(testCtx(t), Base.Add(time.Hour), 10); err != nil || len(open) != 0 {
		t.Fatalf("PendingIntents after decision rows = %+v, %v; want none", open, err)
	}
	for _, bad := range []func(r *audit.Record){
		func(r *audit.Record) { r.Outcome = audit.OutcomeExecuted },
		func(r *audit.Record) { r.Outcome = audit.OutcomePending },
		func(r *audit.Record) { r.Outcome = audit.OutcomeAllowed },
		func(r *audit.Record) { r.Outcome, r.Stage, r.Code = audit.OutcomeRefused, "", "" }, // without stage and code
		func(r *audit.Record) {
			r.Outcome, r.Approval = audit.OutcomeApproved, &audit.Approval{ChallengeID: "chal-1", Approver: "bob"}
		},
	} {
		r := Rec("acme", "dec-bad", audit.PhaseDecision)
		bad(&r)
		if _, err := w.Append(testCtx(t), r); !errors.Is(err, audit.ErrInvalid) {
			t.Fatalf("a decision row with outcome %q stage %q approval %v: %v, want ErrInvalid", r.Outcome, r.Stage, r.Approval, err)
		}
	}
	// A decision's verdict on an outcome row is no outcome, nor an empty command.
	r := Rec("acme", "out-approved", audit.PhaseOutcome)
	r.Outcome = audit.OutcomeApproved
	if _, err := w.Append(testCtx(t), r); !errors.Is(err, audit.ErrInvalid) {
		t.Fatalf("an outcome row with a decision's verdict: %v, want ErrInvalid", err)
	}
	r = Rec("acme", "out-nocommand", audit.PhaseOutcome)
	r.Command = ""
	if _, err := w.Append(testCtx(t), r); !errors.Is(err, audit.ErrInvalid) {
		t.Fatalf("an outcome row without command: %v, want ErrInvalid", err)
	}
}
