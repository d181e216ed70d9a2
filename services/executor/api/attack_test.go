package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/executor"
)

// restPost posts body to the executor's REST gateway with a bearer token
// and extra headers, and returns the status and the decoded body.
func (e *env) restPost(t *testing.T, path, tok, body string, hdr ...string) (int, map[string]any) {
	t.Helper()
	code, m, _ := e.restPostCT(t, path, tok, body, hdr...)
	return code, m
}

// restPostCT is restPost that also returns the response's content type.
func (e *env) restPostCT(t *testing.T, path, tok, body string, hdr ...string) (int, map[string]any, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+e.exec.HTTPAddr()+path, bytes.NewBufferString(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return resp.StatusCode, m, resp.Header.Get("Content-Type")
}

// rowCount returns how many audit rows a tenant's chain holds (its
// newest row's sequence number: the chain has no gaps).
func (e *env) rowCount(t *testing.T, tenant string) int {
	t.Helper()
	page, err := e.audit.Query(context.Background(), audit.Filter{Tenant: tenant, PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Records) == 0 {
		return 0
	}
	return int(page.Records[0].Seq)
}

// TestAttackMetadataIsValidatedAndAudited: attributes besides the
// arguments that break their rules — on the ExecuteRequest, in gRPC
// metadata and in REST headers — are refused at request_check (or, for
// the idempotency key, at idempotency_check, before anyone is asked to
// approve) with a stable code, and every refusal leaves exactly one
// refused row holding the offending value truncated and marked. Nothing
// reaches the backend; no challenge is opened.
func TestAttackMetadataIsValidatedAndAudited(t *testing.T) {
	eachStore(t, testAttackMetadataIsValidatedAndAudited)
}

func testAttackMetadataIsValidatedAndAudited(t *testing.T, st stores) {
	e := start(t, st)
	bot := token(t, "acme", "carol", "finance-bot")
	long := strings.Repeat("c", 300)
	cases := []struct {
		name        string
		run         func() (codes.Code, *mandatev1.CommandError)
		stage, code string
		marked      string // a substring the refused row's conversation or message holds
	}{
		{"conversation of 300 bytes in the request", func() (codes.Code, *mandatev1.CommandError) {
			_, err := e.execute(t, as(bot), "ticket.refund", refundInput, func(r *mandatev1.ExecuteRequest) { r.ConversationId = long })
			return status.Code(err), refusal(err)
		}, "request_check", "request.invalid_metadata", "[invalid] ccc"},
		{"conversation with a NUL byte in the request", func() (codes.Code, *mandatev1.CommandError) {
			_, err := e.execute(t, as(bot), "ticket.refund", refundInput, func(r *mandatev1.ExecuteRequest) { r.ConversationId = "conv\x00x" })
			return status.Code(err), refusal(err)
		}, "request_check", "request.invalid_metadata", `conv\u{0000}x`},
		{"conversation of 300 bytes in gRPC metadata", func() (codes.Code, *mandatev1.CommandError) {
			_, err := e.execute(t, as(bot, "x-mandate-conversation", long), "ticket.refund", refundInput)
			return status.Code(err), refusal(err)
		}, "request_check", "request.invalid_metadata", "[invalid] ccc"},
		{"bidi override in gRPC metadata conversation", func() (codes.Code, *mandatev1.CommandError) {
			_, err := e.execute(t, as(bot), "ticket.refund", refundInput, func(r *mandatev1.ExecuteRequest) { r.ConversationId = "a\u202eb" })
			return status.Code(err), refusal(err)
		}, "request_check", "request.invalid_metadata", `a\u{202E}b`},
		{"malformed traceparent in gRPC metadata", func() (codes.Code, *mandatev1.CommandError) {
			_, err := e.execute(t, as(bot, "traceparent", "00-zz-01"), "ticket.search", `{"query":"x"}`)
			return status.Code(err), refusal(err)
		}, "request_check", "request.invalid_metadata", "[invalid] 00-zz-01"},
		{"approval grant id with a path", func() (codes.Code, *mandatev1.CommandError) {
			_, err := e.execute(t, as(bot), "ticket.refund", refundInput, withGrant("../../etc/passwd"))
			return status.Code(err), refusal(err)
		}, "request_check", "request.invalid_metadata", "[invalid] ../../etc/passwd"},
		{"idempotency key of 256 bytes", func() (codes.Code, *mandatev1.CommandError) {
			_, err := e.execute(t, as(bot), "ticket.refund", refundInput, withKey(strings.Repeat("k", 256)))
			return status.Code(err), refusal(err)
		}, "idempotency_check", "idempotency.invalid_key", "[invalid] kkk"},
		{"idempotency key of 256 bytes in gRPC metadata", func() (codes.Code, *mandatev1.CommandError) {
			_, err := e.execute(t, as(bot, "idempotency-key", strings.Repeat("k", 256)), "ticket.refund", refundInput)
			return status.Code(err), refusal(err)
		}, "idempotency_check", "idempotency.invalid_key", "[invalid] kkk"},
		{"conversation of 300 bytes in a REST header", func() (codes.Code, *mandatev1.CommandError) {
			code, body := e.restPost(t, "/v1/commands/ticket.refund:execute", bot, `{"input":`+refundInput+`}`, "X-Mandate-Conversation", long)
			return problemCode(code), &mandatev1.CommandError{Code: fmt.Sprint(body["code"]), Stage: fmt.Sprint(body["stage"]), InvocationId: fmt.Sprint(body["invocation_id"])}
		}, "request_check", "request.invalid_metadata", "[invalid] ccc"},
		{"idempotency key of 256 bytes in a REST header", func() (codes.Code, *mandatev1.CommandError) {
			code, body := e.restPost(t, "/v1/commands/ticket.refund:execute", bot, `{"input":`+refundInput+`}`, "Idempotency-Key", strings.Repeat("k", 256))
			return problemCode(code), &mandatev1.CommandError{Code: fmt.Sprint(body["code"]), Stage: fmt.Sprint(body["stage"]), InvocationId: fmt.Sprint(body["invocation_id"])}
		}, "idempotency_check", "idempotency.invalid_key", "[invalid] kkk"},
		{"malformed traceparent in a REST header", func() (codes.Code, *mandatev1.CommandError) {
			code, body := e.restPost(t, "/v1/commands/ticket.search:execute", bot, `{"input":{"query":"x"}}`, "traceparent", "01-"+strings.Repeat("0", 32)+"-1-1")
			return problemCode(code), &mandatev1.CommandError{Code: fmt.Sprint(body["code"]), Stage: fmt.Sprint(body["stage"]), InvocationId: fmt.Sprint(body["invocation_id"])}
		}, "request_check", "request.invalid_metadata", "[invalid] 01-000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := e.rowCount(t, "acme")
			code, ce := c.run()
			if code != codes.InvalidArgument || ce.GetStage() != c.stage || ce.GetCode() != c.code || ce.GetInvocationId() == "" {
				t.Fatalf("refused with %v %+v, want InvalidArgument %s %s", code, ce, c.stage, c.code)
			}
			rows := e.rows(t, "acme", ce.GetInvocationId(), 1)
			if len(rows) != 1 || rows[0].Outcome != audit.OutcomeRefused || rows[0].Stage != c.stage || rows[0].Code != c.code {
				t.Fatalf("rows of the refusal: %+v", rows)
			}
			if r := rows[0]; !strings.Contains(r.ConversationID+" "+r.Message, c.marked) {
				t.Fatalf("the row does not hold the marked value %q: conversation %q, message %q", c.marked, r.ConversationID, r.Message)
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
}

// problemCode maps an HTTP status of a problem body back to the gRPC code
// the gateway derived it from (the ones these tests expect).
func problemCode(httpStatus int) codes.Code {
	switch httpStatus {
	case http.StatusBadRequest:
		return codes.InvalidArgument
	case http.StatusUnprocessableEntity:
		return codes.FailedPrecondition
	case http.StatusForbidden:
		return codes.PermissionDenied
	}
	return codes.Unknown
}

// TestAttackBackendDomainRefusalIsNoServerError: a refund larger than what
// was paid is refused by the backend (refund.exceeds_paid at
// pre_invariant). The caller gets that stage and code as a client error —
// FailedPrecondition over gRPC, 422 over REST — never 500 handler.failed;
// the outcome row says refused; a retry with the same key replays the
// same refusal; the gateway moved nothing. The backend is reached without
// its preview, which would refuse the refund before anyone is asked
// (TestPreviewRefusesARefundBeyondWhatIsLeft): here the refusal comes from
// the dispatch.
func TestAttackBackendDomainRefusalIsNoServerError(t *testing.T) {
	eachStore(t, testAttackBackendDomainRefusalIsNoServerError)
}

func testAttackBackendDomainRefusalIsNoServerError(t *testing.T, st stores) {
	e := start(t, st, func(c *executor.Config) { c.Dispatcher = withoutPreview{c.Dispatcher} })
	bot := as(token(t, "acme", "carol", "finance-bot"))
	tooMuch := strings.Replace(refundInput, `"2500"`, `"999999"`, 1)
	_, err := e.execute(t, bot, "ticket.refund", tooMuch, withKey("too-much-1"))
	challenge := refusal(err).GetChallengeId()
	if challenge == "" {
		t.Fatalf("first call: %v", err)
	}
	if _, err := e.confirm.Decide(context.Background(), carol, challenge, true, "api"); err != nil {
		t.Fatal(err)
	}
	_, err = e.execute(t, bot, "ticket.refund", tooMuch, withKey("too-much-1"), withGrant(challenge))
	ce := refusal(err)
	if status.Code(err) != codes.FailedPrecondition || ce.GetStage() != "pre_invariant" || ce.GetCode() != "refund.exceeds_paid" {
		t.Fatalf("refund beyond what was paid: %v %+v", status.Code(err), ce)
	}
	rows := e.rows(t, "acme", ce.GetInvocationId(), 2)
	if len(rows) != 2 || rows[1].Outcome != audit.OutcomeRefused || rows[1].Code != "refund.exceeds_paid" {
		t.Fatalf("rows: %+v", rows)
	}
	// The same key replays the refusal, as a client error.
	_, err = e.execute(t, bot, "ticket.refund", tooMuch, withKey("too-much-1"), withGrant(challenge))
	if status.Code(err) != codes.FailedPrecondition || refusal(err).GetCode() != "refund.exceeds_paid" {
		t.Fatalf("replay: %v %+v", status.Code(err), refusal(err))
	}
	// Over REST: 422 with the stage and code.
	code, body := e.restPost(t, "/v1/commands/ticket.refund:execute", token(t, "acme", "carol", "finance-bot"), `{"input":`+tooMuch+`}`, "Idempotency-Key", "too-much-1")
	if code != http.StatusUnprocessableEntity || body["code"] != "refund.exceeds_paid" || body["stage"] != "pre_invariant" {
		t.Fatalf("REST replay: %d %v", code, body)
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("the gateway counted %d refunds", n)
	}
}

// TestAttackEveryAttemptLeavesOneRow is a property test over the input
// channels' metadata: for any authenticated call with arbitrary
// conversation, idempotency key, grant id and trace context — bytes of any
// length, NUL, invalid UTF-8, bidi controls — over gRPC (request fields and
// metadata) and REST (headers), the trail gains exactly one refused (or
// replayed) row, or an intent and an outcome row, and never anything else.
func TestAttackEveryAttemptLeavesOneRow(t *testing.T) {
	eachStore(t, testAttackEveryAttemptLeavesOneRow)
}

func testAttackEveryAttemptLeavesOneRow(t *testing.T, st stores) {
	e := start(t, st)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 42))
	alice := token(t, "acme", "alice", "support-bot")
	pieces := []string{"", "a", "conv-1", "\x00", "\xff", "\u202e", "\u2066", "é", "-", "_", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", " ", "\n", "%ff"}
	gen := func() string {
		if rng.IntN(4) == 0 {
			return ""
		}
		var b strings.Builder
		for range rng.IntN(6) {
			p := pieces[rng.IntN(len(pieces))]
			b.WriteString(strings.Repeat(p, 1+rng.IntN(90)))
		}
		return b.String()
	}
	ascii := func(s string) string { // gRPC metadata and HTTP headers carry printable ASCII only
		return strings.Map(func(r rune) rune {
			if r < 0x20 || r > 0x7e {
				return 'x'
			}
			return r
		}, s)
	}
	inputs := []struct{ code, input string }{
		{"ticket.search", `{"query":"charged twice"}`},
		{"ticket.refund", refundInput},
		{"no.such.command", `{}`},
	}
	n := 60
	if testing.Short() {
		n = 15
	}
	for i := range n {
		in := inputs[rng.IntN(len(inputs))]
		conv, key, grant, tp := gen(), gen(), gen(), gen()
		before := e.rowCount(t, "acme")
		var invocation string
		switch rng.IntN(3) {
		case 0: // ExecuteRequest fields (any UTF-8 the proto can carry)
			resp, err := e.execute(t, as(alice, "traceparent", ascii(tp)), in.code, in.input, func(r *mandatev1.ExecuteRequest) {
				r.ConversationId, r.IdempotencyKey, r.ApprovalGrantId = strings.ToValidUTF8(conv, "?"), strings.ToValidUTF8(key, "?"), strings.ToValidUTF8(grant, "?")
			})
			invocation = invocationOf(resp, err)
		case 1: // gRPC metadata
			md := []string{"x-mandate-conversation", ascii(conv), "idempotency-key", ascii(key), "x-mandate-approval-grant", ascii(grant), "traceparent", ascii(tp)}
			resp, err := e.execute(t, as(alice, md...), in.code, in.input)
			invocation = invocationOf(resp, err)
		default: // REST headers
			code, body := e.restPost(t, "/v1/commands/"+in.code+":execute", alice, `{"input":`+in.input+`}`,
				"X-Mandate-Conversation", ascii(conv), "Idempotency-Key", ascii(key), "X-Mandate-Approval-Grant", ascii(grant), "traceparent", ascii(tp))
			if code >= 500 {
				t.Fatalf("attempt %d: HTTP %d %v", i, code, body)
			}
			invocation, _ = body["invocation_id"].(string)
		}
		if invocation == "" {
			t.Fatalf("attempt %d (%s): no invocation id", i, in.code)
		}
		rows := e.rows(t, "acme", invocation, 1)
		if len(rows) == 1 && rows[0].Phase == audit.PhaseIntent {
			rows = e.rows(t, "acme", invocation, 2)
		}
		ok := len(rows) == 1 && rows[0].Phase == audit.PhaseOutcome && rows[0].Outcome != audit.OutcomeExecuted ||
			len(rows) == 2 && rows[0].Phase == audit.PhaseIntent && rows[1].Phase == audit.PhaseOutcome
		if !ok {
			t.Fatalf("attempt %d (%s, conv %q, key %q, grant %q, traceparent %q): rows %+v", i, in.code, conv, key, grant, tp, rows)
		}
		if after := e.rowCount(t, "acme"); after != before+len(rows) {
			t.Fatalf("attempt %d: the trail gained %d rows, the invocation has %d", i, after-before, len(rows))
		}
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("the gateway counted %d refunds; support-bot may not refund", n)
	}
}

// invocationOf returns the invocation id of a call's response or error.
func invocationOf(resp *mandatev1.ExecuteResponse, err error) string {
	if err == nil {
		return resp.GetInvocationId()
	}
	return refusal(err).GetInvocationId()
}

// TestDispatchFaultsLeaveTheEffectUnknown: after the call left for the
// backend, a backend that keeps no receipts and never answers (deadline) or
// goes away mid-call leaves the effect unknown — the outcome row says
// unknown, never failed, since the backend may have acted. A call that was
// never sent (no backend configured) failed, and says so.
func TestDispatchFaultsLeaveTheEffectUnknown(t *testing.T) {
	eachStore(t, testDispatchFaultsLeaveTheEffectUnknown)
}

func testDispatchFaultsLeaveTheEffectUnknown(t *testing.T, st stores) {
	stalled := make(chan struct{})
	release := make(chan struct{})
	bsrv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		if m, _ := grpc.MethodFromServerStream(ss); strings.HasPrefix(m, "/mandate.v1.ReceiptService/") {
			return status.Error(codes.Unimplemented, "this backend keeps no receipts")
		}
		stalled <- struct{}{}
		select {
		case <-ss.Context().Done():
			// The server's copy of the deadline may expire first: answer
			// as the client's own deadline would, never "gone".
			return status.FromContextError(ss.Context().Err()).Err()
		case <-release:
		}
		return status.Error(codes.Unavailable, "gone")
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = bsrv.Serve(ln) }()
	t.Cleanup(bsrv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	e := start(t, st, func(c *executor.Config) {
		c.Dispatcher = executor.NewGRPCDispatcher(map[string]grpc.ClientConnInterface{"examples.helpdesk.v1.HelpdeskService": conn})
		c.DefaultDeadline = 300 * time.Millisecond
	})
	alice := as(token(t, "acme", "alice", ""))

	go func() { <-stalled }()
	_, err = e.execute(t, alice, "ticket.search", `{"query":"stalled"}`)
	ce := refusal(err)
	if ce.GetCode() != "handler.deadline_exceeded" || !strings.Contains(ce.GetMessage(), "the effect is unknown") {
		t.Fatalf("stalled backend: %v", err)
	}
	rows := e.rows(t, "acme", ce.GetInvocationId(), 2)
	if len(rows) != 2 || rows[1].Outcome != audit.OutcomeUnknown || rows[1].Code != "handler.deadline_exceeded" {
		t.Fatalf("rows after a stalled backend: %+v", rows)
	}

	// The backend answers Unavailable mid-call (as a dying server does).
	go func() { <-stalled; release <- struct{}{} }()
	_, err = e.execute(t, alice, "ticket.search", `{"query":"dying"}`)
	ce = refusal(err)
	if ce.GetCode() != "handler.unavailable" || !ce.GetRetriable() {
		t.Fatalf("backend gone mid-call: %v", err)
	}
	rows = e.rows(t, "acme", ce.GetInvocationId(), 2)
	if len(rows) != 2 || rows[1].Outcome != audit.OutcomeUnknown || rows[1].Code != "handler.unavailable" {
		t.Fatalf("rows after the backend went away: %+v", rows)
	}

	// No backend for the service: never sent, so failed.
	e2 := start(t, st, func(c *executor.Config) {
		c.Dispatcher = executor.NewGRPCDispatcher(map[string]grpc.ClientConnInterface{})
	})
	_, err = e2.execute(t, alice, "ticket.search", `{"query":"nowhere"}`)
	ce = refusal(err)
	rows = e2.rows(t, "acme", ce.GetInvocationId(), 2)
	if ce.GetCode() != "handler.unavailable" || len(rows) != 2 || rows[1].Outcome != audit.OutcomeFailed {
		t.Fatalf("no backend: %v, rows %+v", err, rows)
	}
}

// stuckOutcomes passes intent rows to the audit trail and never answers
// an append carrying an outcome row until its context ends, as a hung
// audit service would.
type stuckOutcomes struct {
	executor.AuditClient
	attempts atomic.Int32
}

func (s *stuckOutcomes) Append(ctx context.Context, req *mandatev1.AppendRequest, opts ...grpc.CallOption) (*mandatev1.AppendResponse, error) {
	for _, r := range req.GetRecords() {
		if r.GetPhase() == string(audit.PhaseOutcome) {
			s.attempts.Add(1)
			<-ctx.Done()
			return nil, ctx.Err()
		}
	}
	return s.AuditClient.Append(ctx, req, opts...)
}

// TestStuckAuditCannotHangShutdown: every attempt to append an outcome row
// has its own deadline — the relay's, which appends it from the executor's
// outbox, and the flusher's round in flight is abandoned when Close begins
// — so an audit service that accepts the connection and never answers
// cannot keep the executor from closing, and the row is kept in the
// outbox, not lost.
func TestStuckAuditCannotHangShutdown(t *testing.T) { eachStore(t, testStuckAuditCannotHangShutdown) }

func testStuckAuditCannotHangShutdown(t *testing.T, st stores) {
	stuck := &stuckOutcomes{}
	e := start(t, st, func(c *executor.Config) {
		stuck.AuditClient = c.Audit
		c.Audit = stuck
		c.OutcomeAttemptTimeout = 50 * time.Millisecond
	})
	// The short attempt bounds the intent's write to the executor's store
	// too: on a loaded machine a healthy store may miss it, and the call is
	// refused audit.unavailable before anything runs. Only a call that ran
	// tests the shutdown.
	var ran string
	attempts := 0
	for attempt := 1; ; attempt++ {
		attempts = attempt
		resp, err := e.execute(t, as(token(t, "acme", "alice", "")), "ticket.search", `{"query":"x"}`)
		if err == nil {
			ran = resp.GetInvocationId()
			break
		}
		if refusal(err).GetCode() != "audit.unavailable" || attempt == 20 {
			t.Fatal(err)
		}
	}
	// The relay, woken by the outcome row, is stuck on the trail.
	for deadline := time.Now().Add(10 * time.Second); stuck.attempts.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the relay never offered the outcome row to the trail")
		}
	}
	done := make(chan struct{})
	go func() { e.pipeline.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return while the audit service hung")
	}
	// Each attempt's outcome row is stuck too: a refused attempt's (failed)
	// as well as the one that ran.
	spooled, err := e.execStore.Spooled(context.Background(), 32)
	kept := map[string]bool{}
	for _, r := range spooled {
		kept[r.InvocationID] = true
	}
	if err != nil || !kept[ran] || len(kept) != attempts {
		t.Fatalf("after Close: rows of %d invocations spooled (%v), the outcome of %s among them: %v; want it kept in the spool with rows of every attempt (%d)", len(kept), err, ran, kept[ran], attempts)
	}
}

// lossyDispatcher sends calls to the real backend and loses what the
// network can lose: the request (never delivered) or the answer (the
// backend committed, the executor never heard). Receipts can be made
// unreachable too.
type lossyDispatcher struct {
	inner                     *executor.GRPCDispatcher
	loseRequest, loseAnswer   atomic.Bool
	receiptsDown              atomic.Bool
	dispatched, receiptsAsked atomic.Int32
}

func (l *lossyDispatcher) Dispatch(ctx context.Context, d executor.Dispatch) (executor.Reply, error) {
	if l.loseRequest.Load() {
		return executor.Reply{}, status.Error(codes.Unavailable, "connection reset by peer")
	}
	l.dispatched.Add(1)
	out, err := l.inner.Dispatch(ctx, d)
	if err == nil && l.loseAnswer.Load() {
		return executor.Reply{}, status.Error(codes.Unavailable, "connection reset by peer")
	}
	return out, err
}

func (l *lossyDispatcher) Receipt(ctx context.Context, d executor.Dispatch) (executor.Receipt, error) {
	l.receiptsAsked.Add(1)
	if l.receiptsDown.Load() {
		return executor.Receipt{}, status.Error(codes.Unavailable, "connection refused")
	}
	return l.inner.Receipt(ctx, d)
}

// TestReceiptsDecideUnknownEffects: a refund whose answer is lost after the
// backend committed, or whose request never arrived, is settled by the
// backend's receipt (examples/helpdesk records one in the transaction of
// each effect) — the trail tells the truth and a retry never pays twice:
//   - answer lost: the receipt says executed, the caller gets the refund's
//     result, the outcome row says executed, one refund;
//   - request lost: the receipt says not executed (and fences the
//     invocation), the outcome is failed with "nothing was done", and a
//     retry with the same key runs once;
//   - answer lost while receipts are unreachable: the outcome is unknown
//     and a retry with the same key is refused with
//     idempotency.outcome_unknown (not a replayed 503, not a second
//     refund) until the receipt answers; then the retry replays the
//     first call's result.
func TestReceiptsDecideUnknownEffects(t *testing.T) { eachStore(t, testReceiptsDecideUnknownEffects) }

func testReceiptsDecideUnknownEffects(t *testing.T, st stores) {
	lossy := &lossyDispatcher{}
	e := start(t, st, func(c *executor.Config) {
		lossy.inner = c.Dispatcher.(*executor.GRPCDispatcher)
		c.Dispatcher = lossy
	})
	ctx := context.Background()
	bot := as(token(t, "acme", "carol", "finance-bot"))
	approved := func(input, key string) string {
		t.Helper()
		_, err := e.execute(t, bot, "ticket.refund", input, withKey(key))
		ch := refusal(err).GetChallengeId()
		if ch == "" {
			t.Fatalf("no challenge: %v", err)
		}
		if _, err := e.confirm.Decide(ctx, carol, ch, true, "api"); err != nil {
			t.Fatal(err)
		}
		return ch
	}
	refund := func(minor string) string { return strings.Replace(refundInput, `"2500"`, `"`+minor+`"`, 1) }

	// Answer lost: executed by receipt.
	lossy.loseAnswer.Store(true)
	in := refund("100")
	resp, err := e.execute(t, bot, "ticket.refund", in, withKey("lost-answer"), withGrant(approved(in, "lost-answer")))
	if err != nil || resp.GetResult().GetFields()["status"].GetStringValue() != "REFUND_STATUS_ACCEPTED" {
		t.Fatalf("refund whose answer was lost: %v %v", resp, err)
	}
	rows := e.rows(t, "acme", resp.GetInvocationId(), 2)
	if len(rows) != 2 || rows[1].Outcome != audit.OutcomeExecuted {
		t.Fatalf("rows: %+v", rows)
	}
	if n := e.gateway.Refunds(); n != 1 {
		t.Fatalf("gateway counted %d refunds, want 1", n)
	}

	// Request lost: not executed by receipt; the retry runs once.
	lossy.loseAnswer.Store(false)
	lossy.loseRequest.Store(true)
	in = refund("200")
	grant := approved(in, "lost-request")
	_, err = e.execute(t, bot, "ticket.refund", in, withKey("lost-request"), withGrant(grant))
	ce := refusal(err)
	if ce.GetCode() != "handler.unavailable" || !ce.GetRetriable() || !strings.Contains(ce.GetMessage(), "nothing was done") {
		t.Fatalf("refund whose request was lost: %v", err)
	}
	rows = e.rows(t, "acme", ce.GetInvocationId(), 2)
	if len(rows) != 2 || rows[1].Outcome != audit.OutcomeFailed {
		t.Fatalf("rows: %+v", rows)
	}
	lossy.loseRequest.Store(false)
	resp, err = e.execute(t, bot, "ticket.refund", in, withKey("lost-request"), withGrant(approved(in, "lost-request")))
	if err != nil || resp.GetReplayed() {
		t.Fatalf("retry after a lost request: %v %v", resp, err)
	}
	if n := e.gateway.Refunds(); n != 2 {
		t.Fatalf("gateway counted %d refunds, want 2", n)
	}

	// Answer lost and receipts unreachable: unknown, then settled.
	lossy.loseAnswer.Store(true)
	lossy.receiptsDown.Store(true)
	in = refund("300")
	_, err = e.execute(t, bot, "ticket.refund", in, withKey("unknown"), withGrant(approved(in, "unknown")))
	ce = refusal(err)
	first := ce.GetInvocationId()
	if ce.GetCode() != "handler.unavailable" || !strings.Contains(ce.GetMessage(), "the effect is unknown") {
		t.Fatalf("refund with no receipt: %v", err)
	}
	if rows := e.rows(t, "acme", first, 2); len(rows) != 2 || rows[1].Outcome != audit.OutcomeUnknown {
		t.Fatalf("rows: %+v", rows)
	}
	lossy.loseAnswer.Store(false)
	_, err = e.execute(t, bot, "ticket.refund", in, withKey("unknown"))
	if status.Code(err) != codes.Aborted || refusal(err).GetCode() != "idempotency.outcome_unknown" || !refusal(err).GetRetriable() {
		t.Fatalf("retry while the outcome is unknown: %v", err)
	}
	if n := e.gateway.Refunds(); n != 3 {
		t.Fatalf("gateway counted %d refunds, want 3", n)
	}
	lossy.receiptsDown.Store(false)
	dispatched := lossy.dispatched.Load()
	resp, err = e.execute(t, bot, "ticket.refund", in, withKey("unknown"))
	if err != nil || !resp.GetReplayed() || resp.GetInvocationId() != first || resp.GetResult().GetFields()["status"].GetStringValue() != "REFUND_STATUS_ACCEPTED" {
		t.Fatalf("retry once the receipt answers: %v %v", resp, err)
	}
	if n := e.gateway.Refunds(); n != 3 || lossy.dispatched.Load() != dispatched {
		t.Fatalf("gateway counted %d refunds (want 3); dispatched again: %v", n, lossy.dispatched.Load() != dispatched)
	}
}

// flakyAudit is an audit trail that can be taken away and given back.
type flakyAudit struct {
	executor.AuditClient
	down atomic.Bool
	// refused counts the appends refused while down.
	refused atomic.Int32
}

func (f *flakyAudit) Append(ctx context.Context, req *mandatev1.AppendRequest, opts ...grpc.CallOption) (*mandatev1.AppendResponse, error) {
	if f.down.Load() {
		f.refused.Add(1)
		return nil, status.Error(codes.Unavailable, "the audit service is down")
	}
	return f.AuditClient.Append(ctx, req, opts...)
}

// TestAuditOutageLeavesEveryRow: while the audit trail is unavailable
// for longer than the executor retries, a refusal is answered as usual and
// its row waits in the executor's durable spool, and a call runs — its
// intent and outcome wait in the executor's outbox (the same spool), the
// call never waiting for the trail; once the trail is back, every row
// reaches it — every attempt, however long the outage, intent before
// outcome. (Before the intent was kept in the executor's outbox, the
// search was refused audit.unavailable with the trail down.)
func TestAuditOutageLeavesEveryRow(t *testing.T) { eachStore(t, testAuditOutageLeavesEveryRow) }

func testAuditOutageLeavesEveryRow(t *testing.T, st stores) {
	flaky := &flakyAudit{}
	e := start(t, st, func(c *executor.Config) {
		flaky.AuditClient = c.Audit
		c.Audit = flaky
		c.SpoolInterval = 50 * time.Millisecond
	})
	before := e.rowCount(t, "acme")
	flaky.down.Store(true)
	_, err := e.execute(t, as(token(t, "acme", "alice", "support-bot")), "ticket.refund", refundInput)
	refused := refusal(err)
	if refused.GetCode() != "authorization.permission_denied" {
		t.Fatalf("refund by support-bot: %v", err)
	}
	ran, err := e.execute(t, as(token(t, "acme", "alice", "")), "ticket.search", `{"query":"x"}`)
	if err != nil {
		t.Fatalf("search without a trail: %v", err)
	}
	time.Sleep(200 * time.Millisecond) // several flushes, all refused
	if n := e.rowCount(t, "acme"); n != before {
		t.Fatalf("the trail gained %d rows while it was down", n-before)
	}
	flaky.down.Store(false)
	for _, c := range []struct {
		inv      string
		outcomes []string
	}{
		{refused.GetInvocationId(), []string{"refused"}},
		{ran.GetInvocationId(), []string{"pending", "executed"}},
	} {
		var rows []audit.Stored
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if rows, _ = e.audit.Get(context.Background(), "acme", c.inv); len(rows) >= len(c.outcomes) {
				break
			}
		}
		if len(rows) != len(c.outcomes) {
			t.Fatalf("rows of %s after the outage: %+v, want %v", c.inv, rows, c.outcomes)
		}
		for i, r := range rows {
			if string(r.Outcome) != c.outcomes[i] || (i > 0 && r.Seq <= rows[i-1].Seq) {
				t.Fatalf("rows of %s after the outage: %+v, want %v in this order", c.inv, rows, c.outcomes)
			}
		}
	}
	if n := e.rowCount(t, "acme"); n != before+3 {
		t.Fatalf("the trail gained %d rows, want 3", n-before)
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("gateway counted %d refunds", n)
	}
	if v, err := e.audit.Verify(context.Background(), "acme"); err != nil || !v.OK {
		t.Fatalf("verify after the outage: %+v %v", v, err)
	}
}

// spoolDown is an executor store whose spool is unavailable (a database
// outage takes the audit trail and the executor's store together).
type spoolDown struct {
	executor.Store
	down atomic.Bool
}

func (s *spoolDown) Spool(ctx context.Context, row executor.SpooledRow) error {
	if s.down.Load() {
		return executor.ErrUnavailable
	}
	return s.Store.Spool(ctx, row)
}

// SpoolRows is the wrapped store's batch spooling (the executor's outbox
// commits the rows of concurrent calls together), down with Spool.
func (s *spoolDown) SpoolRows(ctx context.Context, rows []executor.SpooledRow, lazy bool) ([]int64, error) {
	if s.down.Load() {
		return nil, executor.ErrUnavailable
	}
	return s.Store.(executor.BatchSpooler).SpoolRows(ctx, rows, lazy)
}

// TestDatabaseOutageHoldsRowsInMemory: when neither the audit trail nor the
// executor's own store takes a row, the executor holds it in memory and
// appends it once the trail is back.
func TestDatabaseOutageHoldsRowsInMemory(t *testing.T) {
	eachStore(t, testDatabaseOutageHoldsRowsInMemory)
}

func testDatabaseOutageHoldsRowsInMemory(t *testing.T, st stores) {
	flaky, store := &flakyAudit{}, &spoolDown{}
	e := start(t, st, func(c *executor.Config) {
		flaky.AuditClient, store.Store = c.Audit, c.Store
		c.Audit, c.Store = flaky, store
		c.SpoolInterval = 50 * time.Millisecond
	})
	flaky.down.Store(true)
	store.down.Store(true)
	_, err := e.execute(t, as(token(t, "acme", "alice", "support-bot")), "ticket.refund", refundInput)
	inv := refusal(err).GetInvocationId()
	if refusal(err).GetCode() != "authorization.permission_denied" || inv == "" {
		t.Fatalf("refund by support-bot: %v", err)
	}
	time.Sleep(200 * time.Millisecond)
	if rows, _ := e.audit.Get(context.Background(), "acme", inv); len(rows) != 0 {
		t.Fatalf("rows while the trail was down: %+v", rows)
	}
	flaky.down.Store(false)
	var rows []audit.Stored
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && len(rows) == 0; time.Sleep(20 * time.Millisecond) {
		rows, _ = e.audit.Get(context.Background(), "acme", inv)
	}
	if len(rows) != 1 || rows[0].Outcome != audit.OutcomeRefused || rows[0].Code != "authorization.permission_denied" {
		t.Fatalf("rows once the trail is back: %+v", rows)
	}
}
