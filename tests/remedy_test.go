package tests

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// TestRemedyIsTrueOnEveryChannel: a confirmation.required refusal says, in
// its structured fields, where the call again must carry the challenge id
// on the channel it came in on — and following it literally, after the
// human approved, runs the call: MCP `_meta`, the Execute route's body
// field, the command's own REST route's header, the command's own gRPC
// method's metadata, and the ExecuteRequest field. Under four eyes the
// refusal names the permission the approver must hold.
func TestRemedyIsTrueOnEveryChannel(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dev := startDev(t)
	carol := dev.tokens["carol"]
	refund := `{"ticket_id":"T-1001","amount":{"currency_code":"EUR","amount_minor":"500"},"reason":"Customer was charged twice","cardholder_reference":"CH4242424242"}`
	approve := func(challenge string) {
		t.Helper()
		if code, body := do(t, http.MethodPost, dev.base+"/v1/challenges/"+challenge+":decide", carol, `{"decision":"DECISION_APPROVE"}`); code != http.StatusOK {
			t.Fatalf("approving %s: %d %v", challenge, code, body)
		}
	}
	want := func(channel, in, name string, gotIn, gotName, remedy string) {
		t.Helper()
		if gotIn != in || gotName != name || !strings.Contains(remedy, name) {
			t.Fatalf("%s: grant_in %q grant_name %q remedy %q; want %s %s", channel, gotIn, gotName, remedy, in, name)
		}
	}

	t.Run("mcp", func(t *testing.T) {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "remedy", Version: "1"}, nil).Connect(context.Background(),
			&mcp.StreamableClientTransport{Endpoint: dev.base + "/mcp", HTTPClient: &http.Client{Transport: bearer{carol}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cs.Close() }()
		m := wantToolRefusal(t, callTool(t, cs, "ticket.refund", refund, nil), "confirmation_check", "confirmation.required")
		in, _ := m["grant_in"].(string)
		name, _ := m["grant_name"].(string)
		remedy, _ := m["remedy"].(string)
		want("mcp", "mcp_meta", "mandate.dev/approval", in, name, remedy)
		approve(m["challenge_id"].(string))
		if res := callTool(t, cs, "ticket.refund", refund, mcp.Meta{name: m["challenge_id"]}); res.IsError {
			t.Fatalf("following the remedy: %s", jsonOf(res))
		}
	})

	t.Run("rest execute", func(t *testing.T) {
		code, body := do(t, http.MethodPost, dev.base+"/v1/commands/ticket.refund:execute", carol, `{"input":`+refund+`}`)
		if code != http.StatusUnprocessableEntity {
			t.Fatalf("%d %v", code, body)
		}
		in, name, remedy := body["grant_in"].(string), body["grant_name"].(string), body["remedy"].(string)
		want("rest execute", "request_field", "approval_grant_id", in, name, remedy)
		approve(body["challenge_id"].(string))
		if code, body := do(t, http.MethodPost, dev.base+"/v1/commands/ticket.refund:execute", carol,
			`{"input":`+refund+`,"`+name+`":"`+body["challenge_id"].(string)+`"}`); code != http.StatusOK {
			t.Fatalf("following the remedy: %d %v", code, body)
		}
	})

	t.Run("rest own route", func(t *testing.T) {
		post := func(header, value string) (int, map[string]any) {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, dev.base+"/v1/tickets/T-1001:refund", strings.NewReader(refund))
			req.Header.Set("Authorization", "Bearer "+carol)
			if header != "" {
				req.Header.Set(header, value)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			b, _ := io.ReadAll(resp.Body)
			var m map[string]any
			_ = json.Unmarshal(b, &m)
			return resp.StatusCode, m
		}
		code, body := post("", "")
		if code != http.StatusUnprocessableEntity {
			t.Fatalf("%d %v", code, body)
		}
		in, name, remedy := body["grant_in"].(string), body["grant_name"].(string), body["remedy"].(string)
		want("rest own route", "http_header", "X-Mandate-Approval-Grant", in, name, remedy)
		approve(body["challenge_id"].(string))
		if code, body := post(name, body["challenge_id"].(string)); code != http.StatusOK {
			t.Fatalf("following the remedy: %d %v", code, body)
		}
	})

	conn, err := grpc.NewClient(dev.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	as := func(kv ...string) context.Context {
		return metadata.NewOutgoingContext(context.Background(), metadata.Pairs(append([]string{"authorization", "Bearer " + carol}, kv...)...))
	}
	issue := &helpdeskv1.IssueRefundRequest{TicketId: "T-1001", Amount: &helpdeskv1.Money{CurrencyCode: "EUR", AmountMinor: 500}, Reason: "Customer was charged twice", CardholderReference: "CH4242424242"}

	t.Run("grpc own method", func(t *testing.T) {
		client := helpdeskv1.NewHelpdeskServiceClient(conn)
		_, err := client.IssueRefund(as(), issue)
		_, _, ce := refusalOf(t, err)
		want("grpc own method", "grpc_metadata", "x-mandate-approval-grant", ce.GetGrantIn(), ce.GetGrantName(), ce.GetRemedy())
		approve(ce.GetChallengeId())
		if _, err := client.IssueRefund(as(ce.GetGrantName(), ce.GetChallengeId()), issue); err != nil {
			t.Fatalf("following the remedy: %v", err)
		}
	})

	t.Run("grpc execute", func(t *testing.T) {
		client := mandatev1.NewExecutorServiceClient(conn)
		in, err := structpb.NewStruct(map[string]any{"ticket_id": "T-1001", "amount": map[string]any{"currency_code": "EUR", "amount_minor": "500"}, "reason": "Customer was charged twice", "cardholder_reference": "CH4242424242"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = client.Execute(as(), &mandatev1.ExecuteRequest{Code: "ticket.refund", Input: in})
		_, _, ce := refusalOf(t, err)
		want("grpc execute", "request_field", "approval_grant_id", ce.GetGrantIn(), ce.GetGrantName(), ce.GetRemedy())
		approve(ce.GetChallengeId())
		if _, err := client.Execute(as(), &mandatev1.ExecuteRequest{Code: "ticket.refund", Input: in, ApprovalGrantId: ce.GetChallengeId()}); err != nil {
			t.Fatalf("following the remedy: %v", err)
		}
	})

	t.Run("four eyes names the approver", func(t *testing.T) {
		code, body := do(t, http.MethodPost, dev.base+"/v1/commands/customer.erase:execute", carol,
			`{"input":{"customer_email":"jane@example.com","reason":"verified deletion request DR-7"}}`)
		if code != http.StatusUnprocessableEntity || body["approver_permission"] != "privacy.approve" ||
			!strings.Contains(body["remedy"].(string), "holds privacy.approve (not carol)") {
			t.Fatalf("%d %v", code, body)
		}
	})
}
