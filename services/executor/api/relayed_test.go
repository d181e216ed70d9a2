package api_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server/inprocess"
)

// TestRelayedIsHonouredOnlyFromTheBridge: ExecuteRequest.relayed — the MCP
// session, the violations that made the input unreadable, the attributes
// the bridge could not read — decides a call only when the MCP bridge
// relays it. The same request from a user's own gRPC client is run as if
// relayed were absent: a client can neither refuse its own calls with
// made-up violations nor claim an MCP session.
func TestRelayedIsHonouredOnlyFromTheBridge(t *testing.T) {
	e := start(t, memoryStores)
	carol := token(t, "acme", "carol", "")
	relayed := func() *mandatev1.ExecuteRequest {
		return &mandatev1.ExecuteRequest{Code: "ticket.search", InputJson: []byte(`{"query":"charged twice"}`), ResultAsJson: true,
			Relayed: &mandatev1.Relayed{McpSessionId: "sess-made-up"}}
	}
	bridgeSrc, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", identity.MCPBridgeService, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bridge := mandatev1.NewExecutorServiceClient(inprocess.Conn(e.exec, bridgeSrc))
	viaBridge := identity.WithRawToken(context.Background(), carol)
	direct := mandatev1.NewExecutorServiceClient(e.conn)

	// The session: recorded from the bridge, not from carol's client.
	for _, tt := range []struct {
		name    string
		client  mandatev1.ExecutorServiceClient
		ctx     context.Context
		session string
		channel string
	}{
		{"bridge", bridge, viaBridge, "sess-made-up", "mcp"},
		{"direct", direct, as(carol), "", "grpc"},
	} {
		resp, err := tt.client.Execute(tt.ctx, relayed())
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		rows := e.rows(t, "acme", resp.GetInvocationId(), 2)
		if len(rows) == 0 {
			t.Fatalf("%s: no audit rows", tt.name)
		}
		for _, r := range rows {
			if r.MCPSessionID != tt.session || string(r.Channel) != tt.channel {
				t.Fatalf("%s: row %s records session %q on channel %q, want %q on %q", tt.name, r.Phase, r.MCPSessionID, r.Channel, tt.session, tt.channel)
			}
		}
	}

	// Violations and invalid attributes refuse the call from the bridge,
	// at the stage that owns them, and are ignored from carol's client.
	for _, tt := range []struct {
		name  string
		set   func(*mandatev1.Relayed)
		stage string
		code  string
	}{
		{"input violations", func(r *mandatev1.Relayed) {
			r.InputViolations = []*mandatev1.Violation{{Pointer: "/query", Rule: "schema.duplicate_member", Message: "query appears twice"}}
		}, "schema_validate", failure.CodeSchemaInvalid},
		{"invalid attribute", func(r *mandatev1.Relayed) {
			r.InvalidAttributes = []*mandatev1.InvalidAttribute{{Name: "conversation", Rule: "metadata.type", Reason: "must be a string", Value: "42"}}
		}, "request_check", failure.CodeRequestInvalidMetadata},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := relayed()
			tt.set(req.Relayed)
			_, err := bridge.Execute(viaBridge, req)
			ce := refusal(err)
			if status.Code(err) != codes.InvalidArgument || ce.GetStage() != tt.stage || ce.GetCode() != tt.code {
				t.Fatalf("from the bridge: %v (stage %q, code %q), want %s at %s", err, ce.GetStage(), ce.GetCode(), tt.code, tt.stage)
			}
			if resp, err := direct.Execute(as(carol), req); err != nil || resp.GetInvocationId() == "" {
				t.Fatalf("from carol's own client: (%v, %v), want the call run with relayed ignored", resp, err)
			}
		})
	}
}
