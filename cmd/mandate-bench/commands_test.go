package main

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// TestParseCommands: -commands defaults to both commands, chooses one,
// keeps the order given, and refuses an unknown or repeated name.
func TestParseCommands(t *testing.T) {
	names := func(cs []command) string {
		var out []string
		for _, c := range cs {
			out = append(out, c.name+"="+c.tool)
		}
		return strings.Join(out, ",")
	}
	cfg, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(cfg.commands); got != "search=ticket.search,write=expense.report.create" {
		t.Errorf("default commands %s", got)
	}
	for _, c := range []struct{ flag, want string }{
		{"write", "write=expense.report.create"},
		{"search", "search=ticket.search"},
		{"write, search", "write=expense.report.create,search=ticket.search"},
	} {
		cfg, err := parseFlags([]string{"-commands", c.flag})
		if err != nil {
			t.Errorf("-commands %q: %v", c.flag, err)
			continue
		}
		if got := names(cfg.commands); got != c.want {
			t.Errorf("-commands %q: %s, want %s", c.flag, got, c.want)
		}
	}
	for _, bad := range []string{"", "delete", "search,search", "search,"} {
		if _, err := parseFlags([]string{"-commands", bad}); err == nil {
			t.Errorf("-commands %q accepted", bad)
		}
	}
}

// TestWriteCarriesAFreshKey: every call of the write carries an
// idempotency key in _meta, where the bridge reads it, a different one on
// every call, beside the _meta the caller gives (the timeline's
// traceparent); the search carries none. A result without what the
// command expects is an error, so a refusal never counts as a call.
func TestWriteCarriesAFreshKey(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []mcp.Meta
	)
	s := mcp.NewServer(&mcp.Implementation{Name: "recorder", Version: "1"}, nil)
	for _, tool := range []string{searchCommand.tool, writeCommand.tool} {
		s.AddTool(&mcp.Tool{Name: tool, InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				mu.Lock()
				seen = append(seen, req.Params.Meta)
				mu.Unlock()
				text := `{"reportId":"ER-2001"}`
				if strings.Contains(string(req.Params.Arguments), "refuse") {
					text = `{"error":"refused"}`
				} else if req.Params.Name == searchCommand.tool {
					text = `{"tickets":[{"ticketId":"T-1001"}]}`
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil
			})
	}
	ct, st := mcp.NewInMemoryTransports()
	ctx := t.Context()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ss.Close() }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.Close() }()

	tp := mcp.Meta{"traceparent": "00-0123456789abcdef0123456789abcdef-00000000000000a1-01"}
	for _, meta := range []mcp.Meta{nil, nil, tp} {
		if err := writeCommand.call(ctx, cs, meta); err != nil {
			t.Fatal(err)
		}
	}
	if err := searchCommand.call(ctx, cs, nil); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, m := range seen[:3] {
		k, _ := m[mcpbridge.MetaIdempotencyKey].(string)
		if !strings.HasPrefix(k, "bench-") {
			t.Errorf("write's _meta %v: no key", m)
		}
		keys = append(keys, k)
	}
	if len(slices.Compact(slices.Sorted(slices.Values(keys)))) != 3 {
		t.Errorf("keys %v: not one per call", keys)
	}
	if seen[2]["traceparent"] != tp["traceparent"] {
		t.Errorf("write's _meta %v lost the caller's traceparent", seen[2])
	}
	if _, ok := seen[3][mcpbridge.MetaIdempotencyKey]; ok {
		t.Errorf("search's _meta %v has a key", seen[3])
	}
	refused := writeCommand
	refused.args = json.RawMessage(`{"title":"refuse"}`)
	if err := refused.call(ctx, cs, nil); err == nil {
		t.Error("a result without a report id counted as a write")
	}
}

// TestReferenceWritesWithTheKey: the in-memory reference creates an expense
// report through the backend, passing the _meta key on as the executor's
// metadata: the same key answers the same report, another key makes
// another; and it still searches.
func TestReferenceWritesWithTheKey(t *testing.T) {
	f := &fleet{dir: t.TempDir(), env: os.Environ()}
	defer func() {
		if err := f.stop(); err != nil {
			t.Error(err)
		}
	}()
	ctx := t.Context()
	p, err := f.reference(ctx, "reference", "")
	if err != nil {
		t.Fatal(err)
	}
	ref := target{name: "reference", endpoint: "http://" + p.httpAddr + "/mcp", procs: []*proc{p}}
	client, done := ref.httpClient(1)
	defer done()
	cs, err := ref.connect(ctx, client, statelessRevision)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cs.Close() }()
	create := func(key string) string {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: writeCommand.tool, Arguments: writeCommand.args,
			Meta: mcp.Meta{mcpbridge.MetaIdempotencyKey: key}})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError || len(res.Content) == 0 {
			t.Fatalf("tool error: %+v", res.Content)
		}
		var r struct {
			ReportID string `json:"reportId"`
			Title    string `json:"title"`
		}
		if err := json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &r); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(r.ReportID, "ER-") || r.Title != "Customer visit Lyon" {
			t.Fatalf("created %+v", r)
		}
		return r.ReportID
	}
	a, again, b := create("k-1"), create("k-1"), create("k-2")
	if a != again || a == b {
		t.Errorf("key k-1 made %s then %s, key k-2 %s: want the same report for one key, another for another", a, again, b)
	}
	for _, c := range []command{searchCommand, writeCommand} {
		if err := c.call(ctx, cs, nil); err != nil {
			t.Errorf("%s: %v", c.tool, err)
		}
	}
}
