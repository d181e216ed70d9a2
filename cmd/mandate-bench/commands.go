package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/services/mcpbridge"
)

// command is one tool the benchmark calls, the same way on every target:
// its arguments, whether each call carries a fresh idempotency key, and
// what its result must contain for the call to count — so that a refusal
// can never pass for a fast call.
type command struct {
	name  string // as -commands names it
	tool  string
	args  json.RawMessage
	keyed bool   // every call carries a fresh key in _meta
	want  string // the result's text contains it
}

// The commands -commands chooses from, in the order a run measures them.
var (
	// searchCommand reads: T-1001 matches its arguments.
	searchCommand = command{name: "search", tool: "ticket.search", args: json.RawMessage(`{"query":"charged twice"}`), want: "T-1001"}
	// writeCommand writes: a draft expense report of one line (the
	// command's example in the proto), a new one on every call, since
	// every call has a key of its own. Every report gets an id ER-….
	writeCommand = command{name: "write", tool: "expense.report.create", keyed: true, want: `"ER-`,
		args: json.RawMessage(`{"title":"Customer visit Lyon","lines":[{"description":"Train Paris-Lyon",` +
			`"amount":{"currency_code":"EUR","amount_minor":8900},"category":"EXPENSE_CATEGORY_TRAVEL"}],"payroll_id":"P-0042"}`)}
	allCommands = []command{searchCommand, writeCommand}
)

// parseCommands reads -commands: names of allCommands, comma-separated,
// each at most once, measured in the order given.
func parseCommands(s string) ([]command, error) {
	var out []command
	for name := range strings.SplitSeq(s, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(allCommands, func(c command) bool { return c.name == name })
		if i < 0 {
			return nil, fmt.Errorf("-commands: unknown command %q (want search, write)", name)
		}
		if slices.ContainsFunc(out, func(c command) bool { return c.name == name }) {
			return nil, fmt.Errorf("-commands: %q twice", name)
		}
		out = append(out, allCommands[i])
	}
	if len(out) == 0 {
		return nil, errors.New("-commands: none")
	}
	return out, nil
}

// keySeq numbers the idempotency keys of a run. Keys are never reused: not
// across targets, and not between the load and the timeline, which write
// to the same database — a key used twice would be answered from its first
// call, and cost less.
var keySeq atomic.Int64

// newKey returns an idempotency key no other call of this run, or of a
// run in another process, carries.
func newKey() string {
	return "bench-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(keySeq.Add(1), 10)
}

// call calls c on cs with meta as the request's _meta (nil: none), plus a
// fresh idempotency key when c is keyed, and accepts only a result that
// contains c.want.
func (c command) call(ctx context.Context, cs *mcp.ClientSession, meta mcp.Meta) error {
	if c.keyed {
		m := mcp.Meta{mcpbridge.MetaIdempotencyKey: newKey()}
		maps.Copy(m, meta)
		meta = m
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: c.tool, Arguments: c.args, Meta: meta})
	if err != nil {
		return err
	}
	if res.IsError || len(res.Content) == 0 {
		return fmt.Errorf("%s: tool error: %+v", c.tool, res.Content)
	}
	if text, ok := res.Content[0].(*mcp.TextContent); !ok || !strings.Contains(text.Text, c.want) {
		return fmt.Errorf("%s: unexpected result: %+v", c.tool, res.Content)
	}
	return nil
}
