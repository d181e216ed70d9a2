package mcpbridge_test

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// TestEveryMCPAttemptLeavesOneRow is a property test over MCP `_meta`, the
// channel a hostile agent runtime controls entirely: for any tools/call
// with arbitrary values (strings of any length with NUL, invalid
// sequences and bidi controls, numbers, booleans, objects, arrays, null)
// under the conversation, idempotency key, approval and trace context
// keys, the trail gains exactly one refused row, or an intent and an
// outcome row, for the call's invocation — and nothing else.
func TestEveryMCPAttemptLeavesOneRow(t *testing.T) {
	e := start(t)
	cs := e.connect(t, token(t, "acme", "alice", "support-bot"))
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	pieces := []string{"a", "conv-1", "\x00", "\u202e", "\u2066", "é", "\ufffd", "-", " ", "\n", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	value := func() any {
		switch rng.IntN(8) {
		case 0:
			return nil
		case 1:
			return rng.IntN(1000)
		case 2:
			return rng.IntN(2) == 0
		case 3:
			return map[string]any{"x": "y"}
		case 4:
			return []any{"a", 1}
		default:
			var b strings.Builder
			for range 1 + rng.IntN(5) {
				b.WriteString(strings.Repeat(pieces[rng.IntN(len(pieces))], 1+rng.IntN(80)))
			}
			return b.String()
		}
	}
	keys := []string{mcpbridge.MetaConversation, mcpbridge.MetaIdempotencyKey, mcpbridge.MetaApproval, mcpbridge.MetaTraceparent, mcpbridge.MetaTracestate}
	tools := []struct{ name, args string }{
		{"ticket.search", `{"query":"charged twice"}`},
		{"ticket.refund", refundInput}, // not alice's: refused at permission_check
	}
	n := 40
	if testing.Short() {
		n = 10
	}
	for i := range n {
		meta := mcp.Meta{}
		for _, k := range keys {
			if rng.IntN(2) == 0 {
				meta[k] = value()
			}
		}
		tool := tools[rng.IntN(len(tools))]
		before := len(e.auditRows(t, "acme"))
		res, err := call(t, cs, tool.name, tool.args, meta)
		if err != nil {
			t.Fatalf("attempt %d (%s, _meta %q): JSON-RPC error %v", i, tool.name, meta, err)
		}
		var inv string
		if res.IsError {
			inv = refusalOf(t, res).InvocationID
		} else {
			inv, _ = res.Meta[mcpbridge.MetaInvocation].(string)
		}
		if inv == "" {
			t.Fatalf("attempt %d: no invocation id in %+v", i, res)
		}
		var mine []audit.Stored
		deadline := time.Now().Add(5 * time.Second)
		for {
			mine = mine[:0]
			rows := e.auditRows(t, "acme")
			for _, r := range rows {
				if r.InvocationID == inv {
					mine = append(mine, r)
				}
			}
			settled := len(mine) == 1 && mine[0].Phase == audit.PhaseOutcome || len(mine) == 2
			if settled && len(rows) == before+len(mine) || time.Now().After(deadline) {
				if len(rows) != before+len(mine) {
					t.Fatalf("attempt %d: the trail gained %d rows, the invocation has %d", i, len(rows)-before, len(mine))
				}
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		ok := len(mine) == 1 && mine[0].Phase == audit.PhaseOutcome && mine[0].Outcome != audit.OutcomeExecuted ||
			len(mine) == 2 && mine[0].Phase != mine[1].Phase
		if !ok {
			t.Fatalf("attempt %d (%s, _meta %q): rows %+v", i, tool.name, meta, mine)
		}
	}
	if n := e.gateway.Refunds(); n != 0 {
		t.Fatalf("gateway counted %d refunds", n)
	}
}
