package mcpbridge

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/edgelimit"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/services/mcpbridge/internal/replica"
	"github.com/mandate-dev/mandate/services/mcpbridge/internal/sealed"
)

// The 2026 tasks extension (SEP-2663, io.modelcontextprotocol/tasks) on
// protocol 2026-07-28: the server decides. A tools/call whose request
// capabilities name the extension and that would be answered with the
// approval-URL refusal (confirmation.required; the form, where it applies,
// is still resolved first as input_required) is answered instead with a
// CreateTaskResult (resultType "task") that waits for the human exactly as
// a 2025-11-25 task does (tasks.go). The client polls tasks/get, whose
// answer carries the call's result inline once the task is completed — a
// refusal (isError) included: failed is for JSON-RPC errors alone.
// tasks/cancel ends it cancelled; tasks/update is acknowledged (these tasks
// never ask for input). Past Config.MaxTasks the server simply makes no
// task: the call is answered as before.
//
// There are no sessions on this revision, so a tasks/get may reach any
// replica. A task id names the replica that holds the task, sealed with the
// state key as session ids are (package sealed); a replica that receives a
// request for another's task forwards it there, and answers "task not
// found" for an id it cannot open — never forwarding it.

// ExtensionTasks identifies the 2026 tasks extension.
const ExtensionTasks = "io.modelcontextprotocol/tasks"

// newTaskID is a random task id; with forwarding on it is sealed to this
// replica as session ids are (package sealed).
func (b *Bridge) newTaskID() string {
	if b.fwd == nil {
		return rand.Text()
	}
	return b.sealer.Seal(sealed.TaskLabel)
}

// taskOwner opens a task id this bridge's replicas issued and returns the
// replica that holds it.
func (b *Bridge) taskOwner(id string) (string, bool) { return b.sealer.Open(sealed.TaskLabel, id) }

// declaresTasks reports whether a 2026 request's capabilities name the
// tasks extension.
func declaresTasks(req *mcp.CallToolRequest) bool {
	if !mayDeclareTasks(req) {
		return false
	}
	caps := req.ClientCapabilities()
	if caps == nil || caps.Extensions == nil {
		return false
	}
	_, ok := caps.Extensions[ExtensionTasks]
	return ok
}

// mayDeclareTasks is false when req's capabilities cannot name the tasks
// extension, told without decoding them: the SDK's ClientCapabilities
// re-encodes the `_meta` capabilities to JSON and decodes that, on every
// call. They cannot when the `_meta` capabilities, the JSON object they
// arrive as, have no member that decodes as extensions (encoding/json
// matches names without regard to case) and the session's capabilities,
// which ClientCapabilities falls back on when the `_meta` ones do not
// decode, do not name it either.
func mayDeclareTasks(req *mcp.CallToolRequest) bool {
	if req.Params == nil {
		return true
	}
	caps, ok := req.Params.Meta[mcp.MetaKeyClientCapabilities].(map[string]any)
	if !ok {
		return true // absent, or not as decoded from JSON: the SDK decides
	}
	for k := range caps {
		if strings.EqualFold(k, "extensions") {
			return true
		}
	}
	if req.Session != nil {
		if p := req.Session.InitializeParams(); p != nil && p.Capabilities != nil {
			if _, ok := p.Capabilities.Extensions[ExtensionTasks]; ok {
				return true
			}
		}
	}
	return false
}

// callMaybeTask runs a 2026 tools/call of a client of the extension: as
// any call, and if its answer is the approval-URL refusal, as a task that
// waits for the human.
func (b *Bridge) callMaybeTask(ctx context.Context, req *mcp.CallToolRequest, c *caller) (mcp.Result, error) {
	tp := &taskProbe{observe: true}
	res, err := b.callTool(context.WithValue(ctx, taskProbeKey{}, tp), req)
	if err != nil || res == nil {
		return res, err
	}
	prob := failure.Problem(failure.ToStatus(tp.refused), "")
	var r Refusal
	if raw, ok := res.Meta[MetaRefusal].(json.RawMessage); ok {
		_ = json.Unmarshal(raw, &r)
	}
	if tp.refused == nil || !res.IsError || tp.call.GrantID != "" || prob.Code != failure.CodeConfirmationRequired ||
		prob.ChallengeID == "" || r.Code != failure.CodeConfirmationRequired || r.ChallengeID != prob.ChallengeID {
		return encoded(res, true), nil
	}
	key := c.info.UserID
	held := b.tasks.reserve(key, b.cfg.MaxTasks)
	if held == nil {
		return encoded(res, true), nil // no task past the cap: the answer as without the extension
	}
	defer b.tasks.release(held)
	name := req.Params.Name
	t, wctx := b.newTask(c, name)
	t.modern = true
	b.waitFor(ctx, t, c, prob, res)
	if !b.goTracked(func() { b.awaitTask(wctx, t, tp.call, res, nil, nil) }) {
		t.cancel()
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the bridge is shutting down"}
	}
	b.tasks.add(t, held)
	b.log.InfoContext(ctx, "mcpbridge: call waits for approval as a task (2026 extension)", "tool", name, "task_id", t.id, "challenge_id", t.challenge)
	w := t.wire2026(b.taskPoll())
	w["resultType"] = "task"
	meta := map[string]any{MetaTaskChallenge: t.challenge}
	if r.InvocationID != "" {
		meta[MetaInvocation] = r.InvocationID
	}
	w["_meta"] = meta
	body, mErr := json.Marshal(w)
	if mErr != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "encoding the task"}
	}
	return &createTaskResult{body: body}, nil
}

// wire2026 is the task in the extension's DetailedTask shape: a completed
// task carries its result, a failed one its JSON-RPC error.
func (t *task) wire2026(poll time.Duration) map[string]any {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := map[string]any{
		"taskId":        t.id,
		"status":        t.status,
		"createdAt":     t.created.UTC().Format(timeLayout),
		"lastUpdatedAt": t.updated.UTC().Format(timeLayout),
		"ttlMs":         t.ttl.Milliseconds(),
	}
	if t.message != "" {
		w["statusMessage"] = t.message
	}
	switch t.status {
	case taskWorking, taskInputRequired:
		w["pollIntervalMs"] = poll.Milliseconds()
	case taskCompleted:
		w["result"] = encoded(t.result, true)
	case taskFailed:
		if t.rpcErr != nil {
			w["error"] = map[string]any{"code": t.rpcErr.Code, "message": t.rpcErr.Message}
		} else {
			w["error"] = map[string]any{"code": jsonrpc.CodeInternalError, "message": t.message}
		}
	}
	return w
}

// answerTask2026 answers tasks/get, tasks/update and tasks/cancel of the
// extension: forwarded to the replica that holds the task, or answered
// here for its owner alone.
func (b *Bridge) answerTask2026(w http.ResponseWriter, r *http.Request, c *caller, id json.RawMessage, method string, params json.RawMessage) {
	var p struct {
		TaskID string `json:"taskId"`
	}
	if json.Unmarshal(params, &p) != nil || p.TaskID == "" {
		writeRPC(w, id, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "invalid params: taskId is required"})
		return
	}
	if b.fwd != nil {
		owner, ok := b.taskOwner(p.TaskID)
		if !ok {
			writeRPC(w, id, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "task not found"})
			return
		}
		if owner != b.advertise {
			b.fwd.ForwardTask(w, r, owner)
			return
		}
	}
	t := b.tasks.get(p.TaskID)
	if t == nil || t.owner != c.info.UserID || !t.modern {
		if t != nil && t.owner != c.info.UserID {
			b.cfg.EdgeRecorder.Record(edgelimit.Refusal{Principal: c.p, Channel: contract.ChannelMCP, Code: failure.CodeTaskNotFound,
				Message: method + " named a task of another principal"})
			b.log.WarnContext(r.Context(), "mcpbridge: a task asked for by another principal", "method", method, "task_id", t.id)
		}
		writeRPC(w, id, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "task not found"})
		return
	}
	t.credentials(c.p, c.token)
	poll := b.taskPoll()
	switch method {
	case "tasks/get":
		out := t.wire2026(poll)
		out["resultType"] = "complete"
		writeRPC(w, id, out, nil)
	case "tasks/update":
		// These tasks never ask for input: nothing is outstanding, and
		// responses to unknown requests are ignored.
		writeRPC(w, id, map[string]any{"resultType": "complete"}, nil)
	case "tasks/cancel":
		if !t.finish(b.now(), taskCancelled, cancelledMessage(t), t.result, nil) {
			writeRPC(w, id, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "the task has already ended"})
			return
		}
		t.cancel()
		out := t.wire2026(poll)
		out["resultType"] = "complete"
		writeRPC(w, id, out, nil)
	}
}

// TaskForwardedHeader marks a 2025-11-25 tasks/* request one replica
// forwarded to the replica that holds the task, from a session of its own:
// "mac:taskId", the mac an HMAC of the task id under the state key, so
// only replicas can set it.
// The request travels without its session id (the session is not the
// owner's), is authenticated again there, and is answered for the task's
// principal alone.
const TaskForwardedHeader = replica.TaskForwardedHeader

// taskPeer returns the task id of a request a replica forwarded to this
// one for that task (TaskForwardedHeader); ok is false for any other.
func (b *Bridge) taskPeer(r *http.Request) (id string, ok bool) {
	if b.fwd == nil {
		return "", false
	}
	return b.fwd.TaskPeer(r)
}

// fromTaskPeer reports whether r was forwarded by a replica for task id.
func (b *Bridge) fromTaskPeer(r *http.Request, id string) bool {
	got, ok := b.taskPeer(r)
	return ok && got == id
}

// forwardToTaskOwner forwards a 2025-11-25 tasks/* request for a task of
// another replica there, without its session id, and reports whether it
// did. A task id no replica sealed stays here (and is not found).
func (b *Bridge) forwardToTaskOwner(w http.ResponseWriter, r *http.Request, id string) bool {
	if b.fwd == nil || id == "" {
		return false
	}
	owner, ok := b.taskOwner(id)
	if !ok || owner == b.advertise {
		return false
	}
	r = r.Clone(r.Context())
	if rb, ok := r.Body.(*replayBody); ok && rb.limited.N > 0 {
		// The whole body is in the read-ahead: send those bytes, not the
		// request's own body, which the server may close once the owner's
		// answer starts (tasks/result flushes its headers at once) — the
		// forwarder's write then failed and broke its read of the answer.
		body := bytes.Clone(rb.buf.Bytes())
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	r.Header.Del(sessionHeader)
	r.Header.Set(TaskForwardedHeader, b.fwd.TaskMark(id))
	b.fwd.ForwardTask(w, r, owner)
	return true
}

// taskIDOf reads params.taskId ("" when absent or not a string).
func taskIDOf(params json.RawMessage) string {
	var p struct {
		TaskID string `json:"taskId"`
	}
	_ = json.Unmarshal(params, &p)
	return p.TaskID
}

// cancelledMessage is a cancelled task's statusMessage.
func cancelledMessage(t *task) string {
	return fmt.Sprintf("Cancelled by the client; the call did not run. The challenge %s stays open at %s: "+
		"once approved there, the call can be sent again with _meta {%q: %q}.", t.challenge, t.approvalURL, MetaApproval, t.challenge)
}
