package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// challengeInStatus finds the challenge id a waiting task's statusMessage
// names.
var challengeInStatus = regexp.MustCompile(`\(challenge ([^)\s]+)\)`)

// TestNodeClientTasks (issue 27 §4): the official TypeScript SDK client,
// declaring task support, calls ticket.refund as payout-bot, a headless
// agent of carol's: `mandate dev` answers with a working task; carol
// approves over REST while the client waits; the client then gets the
// refund's result through tasks/result — having sent tools/call once,
// never calling the tool again — and the trail shows the refund executed
// with carol's approval. Once with callToolStream following the task with
// tasks/get, once going straight to tasks/result, which blocks until the
// approval (no polling at all). It skips without node or
// tests/node/node_modules unless MANDATE_REQUIRE_NODE=1.
func TestNodeClientTasks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary and node")
	}
	node := nodeOrSkip(t)
	dev := startNodeDev(t)
	for _, mode := range []string{"stream", "result"} {
		t.Run(mode, func(t *testing.T) {
			lines, sent := dev.runTask(t, node, mode, "payout-bot@carol", `{"name":"ticket.refund","arguments":`+nodeRefund+`}`,
				func(t *testing.T, task map[string]any) {
					msg, _ := task["statusMessage"].(string)
					m := challengeInStatus.FindStringSubmatch(msg)
					if task["status"] != "working" || m == nil {
						t.Fatalf("the created task %v does not wait for a challenge", task)
					}
					code, body := do(t, http.MethodPost, dev.base+"/v1/challenges/"+m[1]+":decide", dev.tokens["carol"], `{"decision":"DECISION_APPROVE"}`)
					if code != http.StatusOK {
						t.Fatalf("carol approving %s: %d %v", m[1], code, body)
					}
				})
			server := lines[0]
			caps, _ := server["capabilities"].(map[string]any)
			if caps["tasks"] == nil || server["protocolVersion"] != "2025-11-25" {
				t.Fatalf("server line %v: no tasks capability", server)
			}
			taskTools, _ := server["taskTools"].([]any)
			if !slices.Contains(taskTools, any("ticket.refund")) {
				t.Fatalf("ticket.refund does not offer tasks: %v", taskTools)
			}
			last := lines[len(lines)-1]
			if last["type"] != "result" {
				t.Fatalf("the client ended with %v", last)
			}
			res, _ := last["result"].(map[string]any)
			sc, _ := json.Marshal(res["structuredContent"])
			if res["isError"] == true || !strings.Contains(string(sc), "REFUND_STATUS_ACCEPTED") {
				t.Fatalf("the task's result %v", res)
			}
			if sent["tools/call"] != 1 || sent["tasks/result"] != 1 {
				t.Fatalf("the client sent %v: want one tools/call and one tasks/result", sent)
			}
			if mode == "result" && sent["tasks/get"] != 0 {
				t.Fatalf("straight to tasks/result, the client still polled: %v", sent)
			}
			meta, _ := res["_meta"].(map[string]any)
			inv, _ := meta["mandate.dev/invocation_id"].(string)
			if inv == "" {
				t.Fatalf("no invocation id in %v", res)
			}
			executed := false
			for _, row := range dev.auditRows(t, inv, 2) {
				if row["outcome"] == "executed" {
					executed = true
					if appr, _ := row["approval"].(map[string]any); appr == nil || appr["approver"] != "carol" {
						t.Errorf("executed row's approval %v, want carol's", row["approval"])
					}
				}
			}
			if !executed {
				t.Fatal("no executed row")
			}
			t.Logf("%s: %d lines, sent %v", mode, len(lines), sent)
		})
	}

	// finance-bot runs in a client carol operates: its task puts the
	// confirmation form to her (input_required), related to the task, while
	// the client waits on tasks/result; her accept runs the refund.
	t.Run("form inside the task", func(t *testing.T) {
		lines, sent := dev.runTask(t, node, "stream+accept", "finance-bot@carol", `{"name":"ticket.refund","arguments":`+nodeRefund+`}`,
			func(t *testing.T, task map[string]any) {
				// The form may be out before the task is answered.
				if task["status"] != "working" && task["status"] != "input_required" {
					t.Fatalf("created %v", task)
				}
			})
		var forms, inputRequired int
		for _, l := range lines {
			switch l["type"] {
			case "elicitation":
				forms++
				meta, _ := l["meta"].(map[string]any)
				if l["mode"] != "form" || meta["io.modelcontextprotocol/related-task"] == nil {
					t.Errorf("form %v is not related to the task", l)
				}
			case "taskStatus":
				if task, _ := l["task"].(map[string]any); task["status"] == "input_required" {
					inputRequired++
				}
			}
		}
		last := lines[len(lines)-1]
		res, _ := last["result"].(map[string]any)
		sc, _ := json.Marshal(res["structuredContent"])
		// Whether a poll lands while the form is out is timing (the client
		// answers at once); TestTaskShowsTheForm asserts input_required.
		t.Logf("the client saw input_required in %d of its task statuses", inputRequired)
		if forms != 1 || last["type"] != "result" || res["isError"] == true || !strings.Contains(string(sc), "REFUND_STATUS_ACCEPTED") {
			t.Fatalf("%d forms, last line %v", forms, last)
		}
		if sent["tools/call"] != 1 {
			t.Fatalf("the client sent %v", sent)
		}
		meta, _ := res["_meta"].(map[string]any)
		inv, _ := meta["mandate.dev/invocation_id"].(string)
		for _, row := range dev.auditRows(t, inv, 2) {
			if row["outcome"] == "executed" {
				if appr, _ := row["approval"].(map[string]any); appr == nil || appr["channel"] != "mcp_elicitation" {
					t.Errorf("executed row's approval %v, want channel mcp_elicitation", row["approval"])
				}
			}
		}
	})
}

// runTask runs tasks.mjs as who in mode ("stream" or "result", with
// "+accept" or "+decline" to answer forms) with call, hands the created task
// to onCreated while the client waits, and returns every line the client
// printed (the last before "done") and what it sent.
func (d *nodeDev) runTask(t *testing.T, node, mode, who, call string, onCreated func(*testing.T, map[string]any)) ([]map[string]any, map[string]int) {
	t.Helper()
	tok := d.tokens[who]
	if tok == "" {
		t.Fatalf("no dev token for %s", who)
	}
	elicit := "none"
	if m, answer, ok := strings.Cut(mode, "+"); ok {
		mode, elicit = m, answer
	}
	return runTaskScript(t, node, "node", "tasks.mjs", call, onCreated,
		"MCP_URL="+d.base+"/mcp", "MCP_TOKEN="+tok, "MCP_TASK_MODE="+mode, "MCP_ELICIT="+elicit, "MCP_TIMEOUT_MS=60000")
}

// runTaskScript runs script in dir with node and env (the token among
// them, never on the command line), hands each created task to onCreated
// while the client waits, and returns the lines it printed and what it
// sent.
func runTaskScript(t *testing.T, node, dir, script, call string, onCreated func(*testing.T, map[string]any), env ...string) ([]map[string]any, map[string]int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script, call)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	var sent map[string]int
	created := false
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l map[string]any
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s printed %q: %v", script, sc.Text(), err)
		}
		switch l["type"] {
		case "taskCreated":
			task, _ := l["task"].(map[string]any)
			onCreated(t, task)
		case "task": // tasks2026.mjs: every view; the first is the created task
			if !created {
				created = true
				task, _ := l["task"].(map[string]any)
				onCreated(t, task)
			}
		case "done":
			raw, _ := json.Marshal(l["sent"])
			_ = json.Unmarshal(raw, &sent)
			continue
		}
		lines = append(lines, l)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("node %s: %v\nstderr: %s", script, err, tail(stderr.String(), 4000))
	}
	if len(lines) < 2 || sent == nil {
		t.Fatalf("%s printed %v (sent %v)\nstderr: %s", script, lines, sent, tail(stderr.String(), 4000))
	}
	return lines, sent
}

// TestReplicasTypeScriptClientTasks: the TypeScript SDK client's task
// (payout-bot's refund, which carol approves over REST) through nginx
// round robin over two bridge replicas: the task lives on the replica of
// the session, every tasks/get and the tasks/result reach it, and the
// refund is booked once.
func TestReplicasTypeScriptClientTasks(t *testing.T) {
	node := nodeOrSkip(t)
	rt := newReplicaTopology(t)
	via := &devProcess{base: "http://" + rt.lb["mcpbridge"].http, tokens: map[string]string{"payout-bot@carol": rt.token("acme", "carol", "payout-bot")}}
	carol := rt.token("acme", "carol", "")
	lines, sent := via.runTask(t, node, "stream", "payout-bot@carol", `{"name":"ticket.refund","arguments":`+nodeRefund+`}`,
		func(t *testing.T, task map[string]any) {
			msg, _ := task["statusMessage"].(string)
			m := challengeInStatus.FindStringSubmatch(msg)
			if m == nil {
				t.Fatalf("the created task %v names no challenge", task)
			}
			// The human takes a moment: the client polls both replicas.
			time.Sleep(3 * time.Second)
			if r := rt.rest("confirm", http.MethodPost, "/v1/challenges/"+m[1]+":decide", carol, `{"decision":"DECISION_APPROVE"}`); r.status != http.StatusOK {
				t.Fatalf("carol approving: %d %s", r.status, r.raw)
			}
		})
	last := lines[len(lines)-1]
	res, _ := last["result"].(map[string]any)
	sc, _ := json.Marshal(res["structuredContent"])
	if last["type"] != "result" || res["isError"] == true || !strings.Contains(string(sc), "REFUND_STATUS_ACCEPTED") {
		t.Fatalf("through nginx the client ended with %v", last)
	}
	if sent["tools/call"] != 1 || sent["tasks/get"] < 2 {
		t.Fatalf("the client sent %v", sent)
	}
	if n := rt.count(`SELECT count(*) FROM helpdesk.refunds`); n != 1 {
		t.Fatalf("%d refunds booked, want 1", n)
	}
	if h := rt.hits("mcpbridge", false, "/mcp"); h[0] == 0 || h[1] == 0 {
		t.Fatalf("nginx sent the session's POSTs to one replica only: %v", h)
	}
}

// TestNodeClientTasks2026 (SEP-2663): the 2026-07-28 TypeScript client
// (@modelcontextprotocol/client) with the official Tasks extension
// requester (@modelcontextprotocol/ext-tasks), on Node 22 from
// tests/mcpclients, calls ticket.refund as payout-bot: `mandate dev`
// answers with a task (the client declared the extension on the request),
// carol approves over REST, and the requester's tasks/get polling ends
// with the refund's result — one tools/call, the trail showing carol's
// approval. It skips without tests/mcpclients/node_modules unless
// MANDATE_REQUIRE_NODE=1.
func TestNodeClientTasks2026(t *testing.T) {
	c := findMCPClients(t)
	script := filepath.Join("mcpclients", "node_modules", "@modelcontextprotocol", "ext-tasks", "package.json")
	if _, err := os.Stat(script); err != nil {
		if os.Getenv("MANDATE_REQUIRE_NODE") == "1" {
			t.Fatal("tests/mcpclients lacks @modelcontextprotocol/ext-tasks: run npm ci --prefix tests/mcpclients")
		}
		t.Skip("tests/mcpclients lacks @modelcontextprotocol/ext-tasks (npm ci --prefix tests/mcpclients)")
	}
	dev := startNodeDev(t)
	lines, sent := runTaskScript(t, c.node, "mcpclients", "tasks2026.mjs", `{"name":"ticket.refund","arguments":`+nodeRefund+`}`,
		func(t *testing.T, task map[string]any) {
			msg, _ := task["statusMessage"].(string)
			m := challengeInStatus.FindStringSubmatch(msg)
			if task["status"] != "working" || m == nil {
				t.Fatalf("the first task view %v does not wait for a challenge", task)
			}
			if code, body := do(t, http.MethodPost, dev.base+"/v1/challenges/"+m[1]+":decide", dev.tokens["carol"], `{"decision":"DECISION_APPROVE"}`); code != http.StatusOK {
				t.Fatalf("carol approving: %d %v", code, body)
			}
		},
		"MCP_URL="+dev.base+"/mcp", "MCP_TOKEN="+dev.tokens["payout-bot@carol"], "MCP_TIMEOUT_MS=60000")
	if lines[0]["era"] != "modern" {
		t.Fatalf("the client did not speak 2026-07-28: %v", lines[0])
	}
	last := lines[len(lines)-1]
	outcome, _ := last["outcome"].(map[string]any)
	res, _ := outcome["result"].(map[string]any)
	sc, _ := json.Marshal(res["structuredContent"])
	if last["type"] != "outcome" || outcome["status"] != "completed" || res["isError"] == true || !strings.Contains(string(sc), "REFUND_STATUS_ACCEPTED") {
		t.Fatalf("the requester ended with %v", last)
	}
	if sent["tools/call"] != 1 || sent["tasks/get"] == 0 {
		t.Fatalf("the requester sent %v", sent)
	}
	meta, _ := res["_meta"].(map[string]any)
	inv, _ := meta["mandate.dev/invocation_id"].(string)
	executed := false
	for _, row := range dev.auditRows(t, inv, 2) {
		if row["outcome"] == "executed" {
			executed = true
			if appr, _ := row["approval"].(map[string]any); appr == nil || appr["approver"] != "carol" {
				t.Errorf("executed row's approval %v, want carol's", row["approval"])
			}
		}
	}
	if !executed {
		t.Fatal("no executed row")
	}
	t.Logf("%d lines, sent %v", len(lines), sent)
}
