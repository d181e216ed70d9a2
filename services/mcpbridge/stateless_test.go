package mcpbridge_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// TestStatelessToolsList: 2026-07-28 clients get their principal's tools
// without a session, as a private (per-principal) cacheable list: the
// support-bot sees exactly alice's set, carol another one; a 2025-11-25
// client of the same bridge still gets a session.
func TestStatelessToolsList(t *testing.T) {
	st := newHelpdeskStack(t)
	modern := clientOptions{protocol: mcpbridge.ProtocolStateless}
	alice, _ := st.client(t, token(t, "acme", "alice", ""), modern)
	bot, _ := st.client(t, token(t, "acme", "alice", "support-bot"), modern)
	carolCS, _ := st.client(t, token(t, "acme", "carol", ""), modern)
	for _, cs := range []*mcp.ClientSession{alice, bot, carolCS} {
		if id := cs.ID(); id != "" {
			t.Fatalf("2026-07-28 client got session %q", id)
		}
		res, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.CacheScope != "private" {
			t.Fatalf("tools/list cacheScope %q, want private", res.CacheScope)
		}
	}
	aliceNames, botNames, carolNames := names(t, alice), names(t, bot), names(t, carolCS)
	if !slices.Equal(aliceNames, botNames) || !slices.Contains(aliceNames, "ticket.search") || slices.Contains(aliceNames, "ticket.refund") {
		t.Fatalf("alice %v, support-bot %v", aliceNames, botNames)
	}
	if !slices.Contains(carolNames, "ticket.refund") || slices.Equal(aliceNames, carolNames) {
		t.Fatalf("carol %v, alice %v", carolNames, aliceNames)
	}
	legacy, _ := st.client(t, token(t, "acme", "alice", "support-bot"), clientOptions{})
	if legacy.ID() == "" {
		t.Fatal("2025-11-25 client without a session")
	}
	if got := names(t, legacy); !slices.Equal(got, botNames) {
		t.Fatalf("legacy support-bot %v, 2026 support-bot %v", got, botNames)
	}
}

// TestStatelessCall: a 2026-07-28 tools/call runs through the executor
// and is audited on channel mcp, like any other.
func TestStatelessCall(t *testing.T) {
	st := newHelpdeskStack(t)
	bot, _ := st.client(t, token(t, "acme", "alice", "support-bot"), clientOptions{protocol: mcpbridge.ProtocolStateless})
	res, err := call(t, bot, "ticket.search", `{"query":"charged twice"}`, mcp.Meta{mcpbridge.MetaConversation: "conv-2026"})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || res.NeedsInput() {
		t.Fatalf("result %+v", res)
	}
	inv := invocationOf(t, res)
	for _, r := range st.rows(t, "acme", inv, 2) {
		if r.Channel != "mcp" || r.AgentID != "support-bot" || r.UserID != "alice" || r.ConversationID != "conv-2026" {
			t.Fatalf("%s row %+v", r.Phase, r.Record)
		}
	}
	if out := st.outcome(t, "acme", inv); out.Outcome != audit.OutcomeExecuted {
		t.Fatalf("outcome %+v", out.Record)
	}
}

// TestStatelessConfirmationState: the requestState of an input_required
// confirmation is honoured only from the principal it was issued to, for
// the same tool and arguments, before it expires, and once. A tampered,
// foreign, re-targeted or expired state is refused with
// confirmation.invalid_state and decides nothing; the genuine retry runs
// the refund once; replaying it afterwards is refused.
func TestStatelessConfirmationState(t *testing.T) {
	st := newHelpdeskStack(t)
	ctx := context.Background()
	manual := clientOptions{form: true, protocol: mcpbridge.ProtocolStateless, noMRTR: true}
	bot, rec := st.client(t, token(t, "acme", "carol", "finance-bot"), manual)
	first, err := call(t, bot, "ticket.refund", refundInput, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !first.NeedsInput() || first.RequestState == "" || first.IsError || len(first.Content) != 0 {
		t.Fatalf("first result %+v", first)
	}
	form, ok := first.InputRequests[mcpbridge.InputConfirm].(*mcp.ElicitParams)
	if !ok || len(first.InputRequests) != 1 {
		t.Fatalf("inputRequests %+v", first.InputRequests)
	}
	if forms, urls, _ := rec.counts(); forms != 0 || urls != 0 {
		t.Fatalf("server-initiated elicitation on 2026-07-28: %d forms, %d URLs", forms, urls)
	}
	id := challengeOf(t, form)
	if form.Message != mcpbridge.FormMessage(wirePrompt(t, st.confirm, carolFinanceBot, id)) || form.Mode != "form" {
		t.Fatalf("form %+v", form)
	}
	accept := &mcp.ElicitResult{Action: "accept", Content: map[string]any{"approve": true}}
	state := first.RequestState

	refused := func(t *testing.T, cs *mcp.ClientSession, input, state string) {
		t.Helper()
		res, err := retry(cs, input, state, accept)
		if err != nil {
			t.Fatal(err)
		}
		if r := refusalOf(t, res); r.Code != failure.CodeConfirmationInvalidState || r.Stage != "confirmation_check" {
			t.Fatalf("refusal %+v", r)
		}
		if c, err := st.confirm.Get(ctx, carolFinanceBot, id); err != nil || c.State != confirm.StatePending {
			t.Fatalf("challenge after a refused retry: %+v, %v", c, err)
		}
		if n := st.gateway.Refunds(); n != 0 {
			t.Fatalf("gateway counted %d refunds", n)
		}
	}
	t.Run("tampered", func(t *testing.T) {
		body, mac, _ := strings.Cut(state, ".")
		flipped := []byte(body)
		flipped[len(flipped)/2] ^= 1
		refused(t, bot, refundInput, string(flipped)+"."+mac)
		refused(t, bot, refundInput, body+".")
		refused(t, bot, refundInput, "not-a-state")
	})
	t.Run("other principal", func(t *testing.T) {
		carolCS, _ := st.client(t, token(t, "acme", "carol", ""), manual)
		refused(t, carolCS, refundInput, state)
	})
	t.Run("other arguments", func(t *testing.T) {
		refused(t, bot, strings.Replace(refundInput, `"2500"`, `"250000"`, 1), state)
	})
	t.Run("expired", func(t *testing.T) {
		st.clock.Advance(mcpbridge.DefaultStateTTL)
		defer st.clock.Advance(-mcpbridge.DefaultStateTTL)
		refused(t, bot, refundInput, state)
	})

	// The genuine retry, with the arguments re-encoded (other key order).
	var args map[string]any
	if err := json.Unmarshal([]byte(refundInput), &args); err != nil {
		t.Fatal(err)
	}
	reordered, _ := json.MarshalIndent(args, "", "  ")
	res, err := retry(bot, string(reordered), state, accept)
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || res.NeedsInput() {
		t.Fatalf("accepted retry: %+v", res)
	}
	if n := st.gateway.Refunds(); n != 1 {
		t.Fatalf("gateway counted %d refunds, want 1", n)
	}
	out := st.outcome(t, "acme", invocationOf(t, res))
	if out.Approval == nil || out.Approval.Approver != "carol" || out.Approval.Channel != confirm.ChannelMCPElicitation ||
		out.Approval.ChallengeID != id || out.Channel != "mcp" {
		t.Fatalf("outcome %+v approval %+v", out.Record, out.Approval)
	}

	// Single use: the same state again decides and runs nothing.
	again, err := retry(bot, refundInput, state, accept)
	if err != nil {
		t.Fatal(err)
	}
	if r := refusalOf(t, again); r.Code != failure.CodeConfirmationInvalidState {
		t.Fatalf("replayed state: %+v", r)
	}
	if n := st.gateway.Refunds(); n != 1 {
		t.Fatalf("gateway counted %d refunds after a replay, want 1", n)
	}
}

// TestStatelessConfirmationWithoutElicitation: a 2026-07-28 client that
// declared no elicitation gets the approval-URL refusal, no input_required
// result; the retry with the grant runs once a human approved.
func TestStatelessConfirmationWithoutElicitation(t *testing.T) {
	st := newHelpdeskStack(t)
	cs, _ := st.client(t, token(t, "acme", "carol", "finance-bot"), clientOptions{protocol: mcpbridge.ProtocolStateless})
	res, err := call(t, cs, "ticket.refund", refundInput, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := refusalOf(t, res)
	if r.Code != failure.CodeConfirmationRequired || r.ApprovalURL != "http://approve.test/approve/"+r.ChallengeID || res.NeedsInput() {
		t.Fatalf("result %+v", res)
	}
	if _, err := st.confirm.Decide(context.Background(), carolUser, r.ChallengeID, true, confirm.ChannelApprovalPage); err != nil {
		t.Fatal(err)
	}
	res, err = call(t, cs, "ticket.refund", refundInput, mcp.Meta{mcpbridge.MetaApproval: r.ChallengeID})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("approved retry refused: %+v", refusalOf(t, res))
	}
	if n := st.gateway.Refunds(); n != 1 {
		t.Fatalf("gateway counted %d refunds, want 1", n)
	}
}

// TestStatelessWire drives the 2026-07-28 wire by hand, as a client of
// another SDK would: no initialize, the revision and capabilities in
// `_meta`, the Mcp-* headers. Results carry resultType: complete for a
// call that ran, input_required (with inputRequests and requestState, and
// no content) for a confirmation.
func TestStatelessWire(t *testing.T) {
	st := newHelpdeskStack(t)
	post := func(t *testing.T, tok, name, args string) map[string]any {
		t.Helper()
		body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"` + name + `","arguments":` + args +
			`,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"form":{}}}}}}`
		req, err := http.NewRequest(http.MethodPost, st.url+"/mcp", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range map[string]string{
			"Authorization": "Bearer " + tok, "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Mcp-Protocol-Version": mcpbridge.ProtocolStateless, "Mcp-Method": "tools/call", "Mcp-Name": name,
		} {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Mcp-Session-Id") != "" {
			t.Fatalf("status %d, session %q", resp.StatusCode, resp.Header.Get("Mcp-Session-Id"))
		}
		// One JSON body, or an SSE stream whose data line holds it.
		var raw []byte
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				raw = bytes.TrimSpace(d)
			} else if len(bytes.TrimSpace(line)) > 0 && raw == nil && line[0] == '{' {
				raw = append([]byte(nil), line...)
			}
		}
		var msg struct {
			Result map[string]any `json:"result"`
			Error  any            `json:"error"`
		}
		if err := json.Unmarshal(raw, &msg); err != nil || msg.Result == nil {
			t.Fatalf("response %s: %v %v", raw, err, msg.Error)
		}
		return msg.Result
	}
	ran := post(t, token(t, "acme", "alice", "support-bot"), "ticket.search", `{"query":"refund"}`)
	if ran["resultType"] != "complete" || ran["isError"] == true {
		t.Fatalf("search result %v", ran)
	}
	ask := post(t, token(t, "acme", "carol", "finance-bot"), "ticket.refund", refundInput)
	irs, _ := ask["inputRequests"].(map[string]any)
	confirmReq, _ := irs[mcpbridge.InputConfirm].(map[string]any)
	if ask["resultType"] != "input_required" || confirmReq["method"] != "elicitation/create" || ask["requestState"] == "" || ask["content"] != nil {
		t.Fatalf("refund result %v", ask)
	}
	if n := st.gateway.Refunds(); n != 0 {
		t.Fatalf("gateway counted %d refunds", n)
	}
}

// TestStatelessListChanged: a 2026-07-28 client that wants
// tools/list_changed listens with subscriptions/listen; disabling alice
// reaches her agent's stream, and its next list is empty.
func TestStatelessListChanged(t *testing.T) {
	base := start(t)
	e := startBridge(t, base, mcpbridge.Config{StateKey: stateKey})
	cs, changed := e.listen(t, token(t, "acme", "alice", "support-bot"))
	if v := cs.InitializeResult().ProtocolVersion; v != mcpbridge.ProtocolStateless || cs.ID() != "" {
		t.Fatalf("protocol %s, session %q", v, cs.ID())
	}
	before := names(t, cs)
	if err := directory.SetUserDisabled(context.Background(), e.dir, "acme", "alice", true); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no tools/list_changed")
	}
	if after := names(t, cs); len(before) == 0 || len(after) != 0 {
		t.Fatalf("before %v, after %v: want an empty list", before, after)
	}
}

// retry sends the MRTR retry of an input_required tools/call (a new
// request id, as every CallTool).
func retry(cs *mcp.ClientSession, input, state string, answer *mcp.ElicitResult) (*mcp.CallToolResult, error) {
	return cs.CallTool(context.Background(), &mcp.CallToolParams{
		Name: "ticket.refund", Arguments: json.RawMessage(input), RequestState: state,
		InputResponses: mcp.InputResponseMap{mcpbridge.InputConfirm: answer},
	})
}
