package mcpbridge

import (
	"context"
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MetaNarration is the `_meta` key of an ops.review result that asked for
// narration; its value is a Narration.
const MetaNarration = "mandate.dev/narration"

// Narration states of an ops.review result.
const (
	// NarrationDone: the client's model narrated the review.
	NarrationDone = "narrated"
	// NarrationUnavailable: no narration; the result carries the
	// deterministic rendering instead, and Note says why.
	NarrationUnavailable = "unavailable"
)

// narrationMaxTokens bounds the narration asked of the client's model.
const narrationMaxTokens = 2048

// NarrationNeedsSampling is the note a client without the sampling
// capability gets with the deterministic rendering.
const NarrationNeedsSampling = "Narration needs sampling: this client did not declare the sampling capability, " +
	"so Mandate cannot ask its model to narrate. Mandate holds no model API key of its own. " +
	"Below is the deterministic rendering of the review."

// NarrationNeedsSession is the note a 2026-07-28 client gets: that revision
// has no server-initiated requests, so the bridge cannot ask its model.
const NarrationNeedsSession = "Narration needs sampling, which protocol revision 2026-07-28 no longer offers a server; " +
	"connect with 2025-11-25 (or 2025-06-18) and declare sampling to have your model narrate the review. " +
	"Mandate holds no model API key of its own. Below is the deterministic rendering of the review."

// NarrationNeedsPrompt is the note of a review result that carries no
// prompt to narrate (a catalog that did not render one).
const NarrationNeedsPrompt = "The review carries no prompt to narrate: the catalog rendered none."

// Narration is what the bridge adds to an ops.review result that asked for
// narration.
type Narration struct {
	// Status is NarrationDone or NarrationUnavailable.
	Status string `json:"status"`
	// Model is the model the client reported for the narration.
	Model string `json:"model,omitempty"`
	// Text is the client model's narration.
	Text string `json:"text,omitempty"`
	// Note says why there is no narration.
	Note string `json:"note,omitempty"`
}

// wantsNarration reports whether call is an ops.review with narrate: true.
// The executor ran it, so the input is valid.
func wantsNarration(call toolCall) bool {
	if call.Code != reviewCommand {
		return false
	}
	var in struct {
		Narrate bool `json:"narrate"`
	}
	return json.Unmarshal(call.Input, &in) == nil && in.Narrate
}

// narrate adds the narration to the result r of an ops.review that asked
// for it. The review already ran through the executor (governed, audited),
// and its output carries the catalog's prompt: the review rendered for a
// model to narrate. The bridge then asks the calling client's own model,
// through sampling/createMessage, to narrate that prompt. A client without
// sampling, or whose sampling fails, gets the deterministic rendering and a
// note. structuredContent stays the review itself, as its output schema
// says.
func (b *Bridge) narrate(ctx context.Context, req *mcp.CallToolRequest, r *mcp.CallToolResult, output json.RawMessage) {
	var review struct {
		Prompt string `json:"prompt"`
	}
	_ = json.Unmarshal(output, &review)
	prompt := review.Prompt
	if prompt == "" {
		r.Meta[MetaNarration] = Narration{Status: NarrationUnavailable, Note: NarrationNeedsPrompt}
		r.Content = append(r.Content, &mcp.TextContent{Text: NarrationNeedsPrompt})
		return
	}
	n := b.sample(ctx, req, prompt)
	r.Meta[MetaNarration] = n
	if n.Status == NarrationDone {
		r.Content = append(r.Content, &mcp.TextContent{Text: "Narration of the review by the client's model (" + n.Model + "):\n\n" + n.Text})
		return
	}
	r.Content = append(r.Content, &mcp.TextContent{Text: n.Note + "\n\n" + prompt})
}

// sample asks the client's model to narrate prompt.
func (b *Bridge) sample(ctx context.Context, req *mcp.CallToolRequest, prompt string) Narration {
	if modern(req) {
		return Narration{Status: NarrationUnavailable, Note: NarrationNeedsSession}
	}
	caps := req.ClientCapabilities()
	//nolint:staticcheck // Sampling is deprecated from 2026-07-28; the bridge serves 2025-06-18 and 2025-11-25, where it is how a server asks the client's model.
	if req.Session == nil || caps == nil || caps.Sampling == nil {
		return Narration{Status: NarrationUnavailable, Note: NarrationNeedsSampling}
	}
	//nolint:staticcheck // as above: sampling is the protocol's way to use the client's model, and Mandate has none of its own.
	res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{
		Messages:  []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: prompt}}},
		MaxTokens: narrationMaxTokens,
	})
	if err != nil {
		b.log.WarnContext(ctx, "mcpbridge: sampling the narration failed", "tool", reviewCommand, "error", err)
		return Narration{Status: NarrationUnavailable, Note: "The client's model did not narrate the review (sampling failed). Below is the deterministic rendering of the review."}
	}
	text, ok := res.Content.(*mcp.TextContent)
	if !ok || text.Text == "" {
		return Narration{Status: NarrationUnavailable, Model: res.Model, Note: "The client's model answered without text. Below is the deterministic rendering of the review."}
	}
	return Narration{Status: NarrationDone, Model: res.Model, Text: text.Text}
}
