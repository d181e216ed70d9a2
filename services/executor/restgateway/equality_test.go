package restgateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/executor/restgateway"
)

const (
	refund    = `{"amount":{"currency_code":"EUR","amount_minor":"2500"},"reason":"Customer was charged twice","cardholder_reference":"CH4242424242"}`
	newReport = `{"title":"Customer visit Lyon","lines":[{"description":"Train Paris-Lyon","amount":{"currency_code":"EUR","amount_minor":8900},"category":"EXPENSE_CATEGORY_TRAVEL"}],"payroll_id":"P-0042"}`
)

// step is one request of the sequence both gateways are sent.
type step struct {
	name         string
	method, path string
	// as is "user" or "agent@user" of tenant acme; "" sends no token.
	as      string
	body    string
	headers map[string]string
	// grantOf names an earlier step refused with confirmation.required:
	// its challenge, approved by carol, is sent as X-Mandate-Approval-Grant.
	grantOf string
}

// observation is what a client and an auditor see of one step.
type observation struct {
	Status      int
	ContentType string
	Body        any
	Audit       []auditRow
	// Refunds is how many refunds the payment gateway accepted so far.
	Refunds int
}

// auditRow is an audit row without what is random per run (ids, times,
// hashes).
type auditRow struct {
	Phase, Channel, Command, Outcome, Stage, Code, Message string
	Arguments, ArgumentsDigest, Subject, UserID, AgentID   string
	ActorKind, ConversationID                              string
	Approved                                               bool
}

// TestDynamicRoutesEqualGenerated sends the same requests, in the same
// order, to two identical topologies: one serving the helpdesk sample's
// routes through its generated grpc-gateway, one through routes built
// from the sample's descriptor set. Status, content type, body and the
// audit rows each request wrote must be the same.
func TestDynamicRoutesEqualGenerated(t *testing.T) {
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	routes, err := restgateway.New(set)
	if err != nil {
		t.Fatal(err)
	}
	generated := newStack(t, set, func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return helpdeskv1.RegisterHelpdeskServiceHandler(ctx, mux, conn)
	})
	dynamic := newStack(t, set, routes.Register)

	steps := []step{
		{name: "query parameter", method: "GET", path: "/v1/tickets?query=charged%20twice", as: "alice"},
		{name: "repeated and optional query parameters", method: "GET", path: "/v1/tickets?statuses=TICKET_STATUS_OPEN&statuses=TICKET_STATUS_PENDING&customer_email=ana%40example.com&tags=billing", as: "alice"},
		{name: "unknown query parameter", method: "GET", path: "/v1/tickets?nope=1", as: "alice"},
		{name: "query value not of its field's type", method: "GET", path: "/v1/tickets?query=x&page_size=many", as: "alice"},
		{name: "query enum not a value", method: "GET", path: "/v1/tickets?statuses=TICKET_STATUS_NOPE", as: "alice"},
		{name: "path variable", method: "GET", path: "/v1/tickets/T-1001", as: "alice"},
		{name: "path variable and a query the route does not read", method: "GET", path: "/v1/tickets/T-1001?query=x", as: "alice"},
		{name: "path variable of an unknown ticket", method: "GET", path: "/v1/tickets/T-9999", as: "alice"},
		{name: "%ff in the path of a read", method: "GET", path: "/v1/tickets/%ff", as: "alice"},
		{name: "%ff in the path of a write", method: "POST", path: "/v1/tickets/%ff:refund", as: "carol", body: refund},
		{name: "escaped slash in a path variable", method: "GET", path: "/v1/tickets/T-1001%2Fx", as: "alice"},
		{name: "refusal: the agent may not refund", method: "POST", path: "/v1/tickets/T-1001:refund", as: "support-bot@alice", body: refund},
		{name: "body and path: confirmation required", method: "POST", path: "/v1/tickets/T-1001:refund", as: "finance-bot@carol", body: refund,
			headers: map[string]string{"Idempotency-Key": "k-refund-1", "X-Mandate-Conversation": "conv-7"}},
		{name: "approval grant header", method: "POST", path: "/v1/tickets/T-1001:refund", as: "finance-bot@carol", body: refund,
			headers: map[string]string{"Idempotency-Key": "k-refund-1", "X-Mandate-Conversation": "conv-7"}, grantOf: "body and path: confirmation required"},
		{name: "idempotency key replayed", method: "POST", path: "/v1/tickets/T-1001:refund", as: "finance-bot@carol", body: refund,
			headers: map[string]string{"Idempotency-Key": "k-refund-1", "X-Mandate-Conversation": "conv-7"}, grantOf: "body and path: confirmation required"},
		{name: "idempotency key reused with another input", method: "POST", path: "/v1/tickets/T-1002:refund", as: "finance-bot@carol", body: refund,
			headers: map[string]string{"Idempotency-Key": "k-refund-1"}},
		{name: "path variable overrides the body", method: "POST", path: "/v1/tickets/T-1002:refund", as: "carol",
			body: strings.Replace(refund, `{`, `{"ticket_id":"T-1001",`, 1)},
		{name: "malformed body", method: "POST", path: "/v1/tickets/T-1001:refund", as: "carol", body: `{"amount":`},
		{name: "body with an unknown member", method: "POST", path: "/v1/tickets/T-1001:refund", as: "carol", body: strings.Replace(refund, `{`, `{"extra":1,`, 1)},
		{name: "body with a duplicate member", method: "POST", path: "/v1/tickets/T-1001:refund", as: "carol", body: strings.Replace(refund, `"reason":"Customer`, `"reason":"a","reason":"Customer`, 1)},
		{name: "body not an object", method: "POST", path: "/v1/tickets/T-1001:refund", as: "carol", body: `[1,2]`},
		{name: "empty body", method: "POST", path: "/v1/tickets/T-1001:refund", as: "carol"},
		{name: "whole-body route without path variables", method: "POST", path: "/v1/expense-reports", as: "alice", body: newReport,
			headers: map[string]string{"Idempotency-Key": "k-report-1"}},
		{name: "schema refusal", method: "POST", path: "/v1/tickets/T-1001:refund", as: "carol", body: strings.Replace(refund, `"2500"`, `"-5"`, 1)},
		{name: "refusal before the schema is read", method: "POST", path: "/v1/customers:erase", as: "alice", body: `{"customer_email":"not an email","reason":"gdpr"}`},
		{name: "unknown route", method: "GET", path: "/v1/nope", as: "alice"},
		{name: "unknown verb of a known path", method: "POST", path: "/v1/tickets/T-1001:close", as: "alice", body: `{}`},
		{name: "method not allowed", method: "DELETE", path: "/v1/tickets", as: "alice"},
		{name: "no token", method: "GET", path: "/v1/tickets"},
		{name: "a bad token", method: "GET", path: "/v1/tickets", as: "!bad"},
	}
	want := run(t, generated, steps)
	got := run(t, dynamic, steps)
	for i, s := range steps {
		if !reflect.DeepEqual(want[i], got[i]) {
			w, _ := json.MarshalIndent(want[i], "", "  ")
			g, _ := json.MarshalIndent(got[i], "", "  ")
			t.Errorf("%s: the dynamic routes answer otherwise\ngenerated: %s\ndynamic:   %s", s.name, w, g)
		}
	}
	// The sequence did what it says, so that equality is not that of two
	// broken stacks.
	for i, s := range steps {
		t.Logf("%-52s %d %d audit rows", s.name, want[i].Status, len(want[i].Audit))
	}
	checks := map[string]int{
		"query parameter": 200, "path variable": 200, "%ff in the path of a read": 400, "refusal: the agent may not refund": 403,
		"body and path: confirmation required": 422, "approval grant header": 200, "malformed body": 400, "unknown route": 404,
		"method not allowed": 405, "no token": 401, "whole-body route without path variables": 200, "schema refusal": 400,
		"refusal before the schema is read": 403,
	}
	for i, s := range steps {
		if code, ok := checks[s.name]; ok && want[i].Status != code {
			t.Errorf("%s: %d, want %d: %v", s.name, want[i].Status, code, want[i].Body)
		}
	}
	for i, s := range steps {
		if s.name == "path variable overrides the body" && (len(got[i].Audit) == 0 || got[i].Audit[0].Subject != "T-1002") {
			t.Errorf("%s: audited %+v, want subject T-1002", s.name, got[i].Audit)
		}
	}
	// One refund moved: the one approved; the replay moved nothing more.
	if dynamic.gateway.Refunds() != 1 || generated.gateway.Refunds() != 1 {
		t.Errorf("refunds: generated %d, dynamic %d, want 1 each", generated.gateway.Refunds(), dynamic.gateway.Refunds())
	}
}

// run sends the steps to s in order; carol approves every challenge a
// later step redeems.
func run(t *testing.T, s *stack, steps []step) []observation {
	t.Helper()
	var out []observation
	challenges := map[string]string{}
	carol := identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "carol"}
	before := len(s.settled(t, "acme"))
	for _, st := range steps {
		req, err := http.NewRequest(st.method, s.base+st.path, strings.NewReader(st.body))
		if err != nil {
			t.Fatal(err)
		}
		if st.body == "" {
			req.Body = http.NoBody
		}
		req.Header.Set("Content-Type", "application/json")
		switch {
		case st.as == "!bad":
			req.Header.Set("Authorization", "Bearer not-a-token")
		case st.as != "":
			user, agent := st.as, ""
			if a, u, ok := strings.Cut(st.as, "@"); ok {
				user, agent = u, a
			}
			req.Header.Set("Authorization", "Bearer "+token(t, "acme", user, agent))
		}
		for k, v := range st.headers {
			req.Header.Set(k, v)
		}
		if st.grantOf != "" {
			ch := challenges[st.grantOf]
			if ch == "" {
				t.Fatalf("%s: step %q gave no challenge", st.name, st.grantOf)
			}
			req.Header.Set("X-Mandate-Approval-Grant", ch)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		var body any
		if err := json.Unmarshal(raw, &body); err != nil {
			body = "not JSON: " + string(raw)
		}
		if m, ok := body.(map[string]any); ok {
			if ch, _ := m["challenge_id"].(string); ch != "" {
				challenges[st.name] = ch
				if _, err := s.confirm.Decide(context.Background(), carol, ch, true, "api"); err != nil {
					t.Fatalf("%s: approving %s: %v", st.name, ch, err)
				}
			}
		}
		rows := s.settled(t, "acme")
		var written []auditRow
		for _, r := range rows[before:] {
			written = append(written, auditRow{
				Phase: string(r.Phase), Channel: string(r.Channel), Command: r.Command, Outcome: string(r.Outcome),
				Stage: r.Stage, Code: r.Code, Message: normalize(r.Message).(string), Arguments: string(r.Arguments), ArgumentsDigest: r.ArgumentsDigest,
				Subject: r.Subject, UserID: r.UserID, AgentID: r.AgentID, ActorKind: string(r.ActorKind), ConversationID: r.ConversationID,
				Approved: r.Approval != nil,
			})
		}
		before = len(rows)
		out = append(out, observation{Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Body: normalize(body),
			Audit: written, Refunds: s.gateway.Refunds()})
	}
	return out
}

var (
	// Values random per run: ids the executor, confirm and the backend
	// mint, and times.
	randomKeys = map[string]bool{"invocation_id": true, "audit_id": true, "challenge_id": true, "approval_url": true,
		"refund_id": true, "report_id": true, "gateway_refund_id": true}
	timestamp = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$`)
	idInText  = regexp.MustCompile(`\b(inv|ch|chg|rf|er|rep)_[0-9A-Za-z]+`)
)

// normalize replaces what differs between two runs of the same request.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && randomKeys[k] && s != "" {
				x[k] = "<" + k + ">"
				continue
			}
			x[k] = normalize(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
		return x
	case string:
		if _, err := time.Parse(time.RFC3339Nano, x); err == nil && timestamp.MatchString(x) {
			return "<time>"
		}
		return idInText.ReplaceAllString(x, "<id>")
	}
	return v
}
