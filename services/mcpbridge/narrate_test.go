package mcpbridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/tooldesc"
	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/catalog"
	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// narrationOf decodes the narration in a result's `_meta`.
func narrationOf(t *testing.T, res *mcp.CallToolResult) mcpbridge.Narration {
	t.Helper()
	raw, err := json.Marshal(res.Meta[mcpbridge.MetaNarration])
	if err != nil {
		t.Fatal(err)
	}
	var n mcpbridge.Narration
	if err := json.Unmarshal(raw, &n); err != nil {
		t.Fatalf("narration %s: %v", raw, err)
	}
	return n
}

// TestReviewNarration: ops.review with narrate runs through the executor
// (audited) and then, for a client with sampling, asks the client's model
// with exactly catalog.ToPrompt of the manifest and returns its narration
// and model; a client without sampling gets the deterministic rendering
// and a note; without narrate nobody is asked.
func TestReviewNarration(t *testing.T) {
	st := newHelpdeskStack(t)
	prompt := catalog.ToPrompt(st.set.Manifest(), tooldesc.Options{})
	const canned = "Two findings matter most: ticket.refund moves money and cardholder_reference is sensitive."
	tok := token(t, "acme", "olga", "")

	t.Run("client with sampling", func(t *testing.T) {
		cs, rec := st.client(t, tok, clientOptions{sample: &samplingResult{
			Role: "assistant", Model: "client-model-7", Content: &mcp.TextContent{Text: canned}, StopReason: "endTurn",
		}})
		res, err := call(t, cs, catalog.ReviewCommand, `{"narrate":true}`, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError {
			t.Fatalf("refused: %+v", refusalOf(t, res))
		}
		if _, _, samples := rec.counts(); samples != 1 {
			t.Fatalf("%d sampling requests, want 1", samples)
		}
		req := rec.samples[0]
		if len(req.Messages) != 1 || req.Messages[0].Role != "user" || req.MaxTokens <= 0 {
			t.Fatalf("sampling request %+v", req)
		}
		text, ok := req.Messages[0].Content.(*mcp.TextContent)
		if !ok || text.Text != prompt {
			t.Fatalf("the bridge did not send ToPrompt's bytes: %+v", req.Messages[0].Content)
		}
		n := narrationOf(t, res)
		if n.Status != mcpbridge.NarrationDone || n.Model != "client-model-7" || n.Text != canned {
			t.Fatalf("narration %+v", n)
		}
		if len(res.Content) != 2 || !strings.Contains(res.Content[1].(*mcp.TextContent).Text, canned) ||
			!strings.Contains(res.Content[1].(*mcp.TextContent).Text, "client-model-7") {
			t.Fatalf("content %+v", res.Content)
		}
		review, _ := res.StructuredContent.(map[string]any)
		if review["prompt"] != prompt || review["manifest_digest"] != st.set.Digest() {
			t.Fatalf("structured content is not the review: %v", review)
		}
		if out := st.outcome(t, "acme", invocationOf(t, res)); out.Outcome != audit.OutcomeExecuted || out.Command != catalog.ReviewCommand || out.UserID != "olga" {
			t.Fatalf("audit outcome %+v", out.Record)
		}
	})

	t.Run("client without sampling", func(t *testing.T) {
		cs, _ := st.client(t, tok, clientOptions{})
		res, err := call(t, cs, catalog.ReviewCommand, `{"narrate":true}`, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError {
			t.Fatalf("refused: %+v", refusalOf(t, res))
		}
		n := narrationOf(t, res)
		if n.Status != mcpbridge.NarrationUnavailable || n.Note != mcpbridge.NarrationNeedsSampling || n.Text != "" {
			t.Fatalf("narration %+v", n)
		}
		if len(res.Content) != 2 || res.Content[1].(*mcp.TextContent).Text != mcpbridge.NarrationNeedsSampling+"\n\n"+prompt {
			t.Fatalf("content %+v", res.Content)
		}
		st.outcome(t, "acme", invocationOf(t, res))
	})

	t.Run("2026-07-28 client, which cannot be sampled", func(t *testing.T) {
		cs, rec := st.client(t, tok, clientOptions{protocol: mcpbridge.ProtocolStateless, sample: &samplingResult{Model: "m", Content: &mcp.TextContent{Text: "x"}}})
		res, err := call(t, cs, catalog.ReviewCommand, `{"narrate":true}`, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, samples := rec.counts(); samples != 0 {
			t.Fatalf("%d sampling requests on a stateless request", samples)
		}
		n := narrationOf(t, res)
		if res.IsError || n.Status != mcpbridge.NarrationUnavailable || n.Note != mcpbridge.NarrationNeedsSession {
			t.Fatalf("narration %+v (isError %v)", n, res.IsError)
		}
		if len(res.Content) != 2 || res.Content[1].(*mcp.TextContent).Text != mcpbridge.NarrationNeedsSession+"\n\n"+prompt {
			t.Fatalf("content %+v", res.Content)
		}
	})

	t.Run("no narration asked", func(t *testing.T) {
		cs, rec := st.client(t, tok, clientOptions{sample: &samplingResult{Model: "m", Content: &mcp.TextContent{Text: "x"}}})
		res, err := call(t, cs, catalog.ReviewCommand, `{}`, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, samples := rec.counts(); samples != 0 || res.IsError || len(res.Content) != 1 || res.Meta[mcpbridge.MetaNarration] != nil {
			t.Fatalf("%d sampling requests, result %+v", samples, res)
		}
	})

	t.Run("caller without ops.read", func(t *testing.T) {
		cs, rec := st.client(t, token(t, "acme", "alice", "support-bot"), clientOptions{sample: &samplingResult{Model: "m", Content: &mcp.TextContent{Text: "x"}}})
		res, err := call(t, cs, catalog.ReviewCommand, `{"narrate":true}`, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r := refusalOf(t, res); r.Code != "authorization.permission_denied" || r.Stage != "permission_check" {
			t.Fatalf("refusal %+v", r)
		}
		if _, _, samples := rec.counts(); samples != 0 {
			t.Fatalf("a refused review was narrated (%d sampling requests)", samples)
		}
	})
}

// reviewWithoutPrompt answers every call with a review that carries no
// prompt, as a catalog that rendered none would.
type reviewWithoutPrompt struct{}

func (reviewWithoutPrompt) Execute(context.Context, *mandatev1.ExecuteRequest, ...grpc.CallOption) (*mandatev1.ExecuteResponse, error) {
	return &mandatev1.ExecuteResponse{InvocationId: "inv-review", ResultJson: []byte(`{"findings":[]}`)}, nil
}

// TestReviewNarrationNeedsThePrompt: the bridge narrates the prompt the
// catalog rendered, never one of its own; a review without one is
// returned with a note, and the client's model is not asked.
func TestReviewNarrationNeedsThePrompt(t *testing.T) {
	e := startBridge(t, start(t), mcpbridge.Config{Executor: reviewWithoutPrompt{}})
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		//nolint:staticcheck // sampling is deprecated from 2026-07-28; the bridge narrates through it on 2025-11-25
		CreateMessageHandler: func(context.Context, *mcp.CreateMessageRequest) (*samplingResult, error) {
			t.Error("the bridge sampled without a prompt")
			return nil, errors.New("unexpected")
		},
	})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: e.url + "/mcp", HTTPClient: &http.Client{Transport: bearer{token(t, "acme", "olga", "")}}, DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	res, err := call(t, cs, catalog.ReviewCommand, `{"narrate":true}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := narrationOf(t, res)
	if res.IsError || n.Status != mcpbridge.NarrationUnavailable || n.Note != mcpbridge.NarrationNeedsPrompt {
		t.Fatalf("narration %+v (isError %v)", n, res.IsError)
	}
	if len(res.Content) != 2 || res.Content[1].(*mcp.TextContent).Text != mcpbridge.NarrationNeedsPrompt {
		t.Fatalf("content %+v", res.Content)
	}
}
