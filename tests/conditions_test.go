package tests

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// conditionRefund is a refund of amount minor units on acme's T-1001
// (paid 49.90 EUR).
func conditionRefund(amount string) string {
	return `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"` + amount + `"},"reason":"Customer was charged twice","cardholder_reference":"CH4242424242"}`
}

// TestConditionsOnEveryChannel: the sample's ticket.refund declares its
// conditions (a human from 1.00 on; no agent refund above 10,000.00), and
// every channel — MCP through the bridge, REST (execute and the command's
// own route), gRPC ExecutorService — meets them alike: a 0.50 refund runs
// without anyone asked; a 25.00 refund asks a human (confirmation.required
// at confirmation_check, saying which condition asks); an agent's 20,000.00
// refund is refused at condition_check with condition.denied naming the
// condition, before anyone is asked. Check mode says the same.
func TestConditionsOnEveryChannel(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dev := startDev(t)
	carol, bot := dev.tokens["carol"], dev.tokens["finance-bot@carol"]
	const asks, denies = "refund-needs-a-human", "agents-refund-at-most-10000"

	t.Run("mcp", func(t *testing.T) {
		connect := func(tok string) *mcp.ClientSession {
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "conditions", Version: "1"}, nil).Connect(context.Background(),
				&mcp.StreamableClientTransport{Endpoint: dev.base + "/mcp", HTTPClient: &http.Client{Transport: bearer{tok}}, DisableStandaloneSSE: true}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			return cs
		}
		cs := connect(carol)
		if res := callTool(t, cs, "ticket.refund", conditionRefund("50"), nil); res.IsError {
			t.Fatalf("a 0.50 refund over MCP: %s", jsonOf(res))
		}
		m := wantToolRefusal(t, callTool(t, cs, "ticket.refund", conditionRefund("2500"), nil), "confirmation_check", "confirmation.required")
		if msg, _ := m["message"].(string); !strings.Contains(msg, asks) {
			t.Errorf("the refusal does not say which condition asks: %v", m)
		}
		m = wantToolRefusal(t, callTool(t, connect(bot), "ticket.refund", conditionRefund("2000000"), nil), "condition_check", "condition.denied")
		if msg, _ := m["message"].(string); !strings.Contains(msg, denies) {
			t.Errorf("the refusal does not name the condition: %v", m)
		}
		// The tool the agent lists says when a human is asked.
		listed, err := connect(bot).ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, tl := range listed.Tools {
			if tl.Name == "ticket.refund" {
				found = strings.Contains(tl.Description, "When a human is asked: a human is asked for a refund of 1.00 or more")
			}
		}
		if !found {
			t.Error("ticket.refund's tool description does not say when a human is asked")
		}
	})

	t.Run("rest", func(t *testing.T) {
		if code, body := do(t, http.MethodPost, dev.base+"/v1/commands/ticket.refund:execute", carol, `{"input":`+conditionRefund("50")+`}`); code != http.StatusOK {
			t.Fatalf("a 0.50 refund through execute: %d %v", code, body)
		}
		if code, body := do(t, http.MethodPost, dev.base+"/v1/tickets/T-1001:refund", carol,
			`{"amount":{"currency_code":"EUR","amount_minor":"50"},"reason":"Customer was charged twice","cardholder_reference":"CH4242424242"}`); code != http.StatusOK {
			t.Fatalf("a 0.50 refund over its own route: %d %v", code, body)
		}
		code, body := do(t, http.MethodPost, dev.base+"/v1/tickets/T-1001:refund", carol,
			`{"amount":{"currency_code":"EUR","amount_minor":"2500"},"reason":"Customer was charged twice","cardholder_reference":"CH4242424242"}`)
		if code != http.StatusUnprocessableEntity || body["code"] != "confirmation.required" || body["stage"] != "confirmation_check" ||
			!strings.Contains(body["detail"].(string), asks) {
			t.Fatalf("a 25.00 refund over its own route: %d %v", code, body)
		}
		code, body = do(t, http.MethodPost, dev.base+"/v1/commands/ticket.refund:execute", bot, `{"input":`+conditionRefund("2000000")+`}`)
		if code != http.StatusForbidden || body["code"] != "condition.denied" || body["stage"] != "condition_check" || !strings.Contains(body["detail"].(string), denies) {
			t.Fatalf("an agent's 20,000.00 refund through execute: %d %v", code, body)
		}
		code, body = do(t, http.MethodPost, dev.base+"/v1/commands/ticket.refund:check", bot, `{"input":`+conditionRefund("2000000")+`}`)
		if reason, _ := body["reason"].(map[string]any); code != http.StatusOK || body["verdict"] != "VERDICT_REFUSED" || reason["code"] != "condition.denied" {
			t.Fatalf("the check of an agent's 20,000.00 refund: %d %v", code, body)
		}
	})

	t.Run("grpc", func(t *testing.T) {
		conn, err := grpc.NewClient(dev.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		client := mandatev1.NewExecutorServiceClient(conn)
		as := func(tok string) context.Context {
			return metadata.NewOutgoingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok))
		}
		input := func(amount string) *structpb.Struct {
			var m map[string]any
			if err := json.Unmarshal([]byte(conditionRefund(amount)), &m); err != nil {
				t.Fatal(err)
			}
			s, err := structpb.NewStruct(m)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		if _, err := client.Execute(as(carol), &mandatev1.ExecuteRequest{Code: "ticket.refund", Input: input("50")}); err != nil {
			t.Fatalf("a 0.50 refund over gRPC: %v", err)
		}
		_, err = client.Execute(as(carol), &mandatev1.ExecuteRequest{Code: "ticket.refund", Input: input("2500")})
		if c, reason, ce := refusalOf(t, err); c != codes.FailedPrecondition || reason != "confirmation.required" || !strings.Contains(ce.GetMessage(), asks) {
			t.Fatalf("a 25.00 refund over gRPC: %v %s %v", c, reason, ce)
		}
		_, err = client.Execute(as(bot), &mandatev1.ExecuteRequest{Code: "ticket.refund", Input: input("2000000")})
		if c, reason, ce := refusalOf(t, err); c != codes.PermissionDenied || reason != "condition.denied" || ce.GetStage() != "condition_check" || !strings.Contains(ce.GetMessage(), denies) {
			t.Fatalf("an agent's 20,000.00 refund over gRPC: %v %s %v", c, reason, ce)
		}
		v, err := client.Check(as(carol), &mandatev1.ExecuteRequest{Code: "ticket.refund", Input: input("2500")})
		if err != nil || v.GetVerdict() != mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED || !strings.Contains(v.GetReason().GetMessage(), asks) {
			t.Fatalf("the check of a 25.00 refund: %v %v", v, err)
		}
		v, err = client.Check(as(carol), &mandatev1.ExecuteRequest{Code: "ticket.refund", Input: input("50")})
		if err != nil || v.GetVerdict() != mandatev1.Verdict_VERDICT_ALLOWED {
			t.Fatalf("the check of a 0.50 refund: %v %v", v, err)
		}
	})
}
