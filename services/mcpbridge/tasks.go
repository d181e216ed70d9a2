package mcpbridge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/edgelimit"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// MCP tasks (protocol 2025-11-25, experimental): a tools/call whose params
// carry `task` is answered at once with a CreateTaskResult, and its result
// is fetched later with tasks/get and tasks/result. The bridge uses them
// for the one wait that can be long, a human's approval: a task-augmented
// call runs through the executor as any call does; when it is refused
// confirmation.required, the task waits (status working) for the challenge
// to be decided (ConfirmService.Await), then runs the call again with the
// challenge as its grant — the same pipeline, every stage — and the task
// ends with what the executor answered: completed, or failed with the
// executor's refusal (declined: confirmation.refused; expired: the
// executor's refusal of an expired grant). Where the call without a task
// would have shown the confirmation form (interactive host, form
// elicitation), the task is input_required while the form, related to the
// task, is out on the session's standalone stream (askInTask). Any other
// call ends its task at once with its result. Nothing runs on the
// client's word: the task is only a way to wait. The 2026 extension
// (SEP-2663) is in tasks2026.go.
//
// The go-sdk v1.8.0 server knows nothing of tasks: it drops `task` from a
// tools/call's params, has no tasks capability or tool `execution` field,
// and answers unknown methods (tasks/get, …) itself in its transport,
// before any middleware. So the bridge reads the message on the HTTP
// request (serveTasks, after authentication and the envelope check), hands
// a task-augmented call to its tools/call middleware on the request's
// TokenInfo (caller.task), answers tasks/* itself for a session of the
// caller's, and splices `capabilities.tasks` into the initialize result and
// `execution.taskSupport: "optional"` into the governed tools of the
// tools/list result, for sessions of protocol 2025-11-25.
//
// Tasks live in the memory of the replica whose session created them, as
// a session and a pending elicitation do: every request of that session
// reaches that replica (internal/replica). A task belongs to the principal that
// created it; any other principal is answered "task not found", and the
// attempt is recorded (task.not_found). A principal holds at most
// Config.MaxTasks tasks waiting for a human on a bridge (task.too_many,
// HTTP 429, recorded); finished tasks are kept for TaskRetention and at
// most maxFinishedTasks per principal.

// DefaultMaxTasks bounds the tasks one principal may have waiting for a
// human on one bridge.
const DefaultMaxTasks = 16

// DefaultTaskPollInterval is the pollInterval a task suggests.
const DefaultTaskPollInterval = 2 * time.Second

// TaskRetention is how long a finished task, and its result, are kept.
const TaskRetention = 10 * time.Minute

// maxFinishedTasks bounds the finished tasks kept per principal: past it
// the oldest is dropped.
const maxFinishedTasks = 64

// timeLayout is how tasks show their timestamps (ISO 8601).
const timeLayout = time.RFC3339Nano

// ProtocolTasks is the revision whose (experimental) tasks the bridge
// serves.
const ProtocolTasks = "2025-11-25"

// Task statuses (2025-11-25).
const (
	taskWorking       = "working"
	taskInputRequired = "input_required"
	taskCompleted     = "completed"
	taskFailed        = "failed"
	taskCancelled     = "cancelled"
)

const (
	// metaRelatedTask relates a tasks/result result to its task.
	metaRelatedTask = "io.modelcontextprotocol/related-task"
	// metaImmediate is the text a host may hand its model at once.
	metaImmediate = "io.modelcontextprotocol/model-immediate-response"
	// MetaTaskChallenge is the `_meta` key of a CreateTaskResult that names
	// the challenge the task waits for.
	MetaTaskChallenge = "mandate.dev/challenge_id"
)

// taskRequest is a tools/call's `task` param, as serveTasks read it.
type taskRequest struct {
	TTL *int64 `json:"ttl,omitempty"`
}

// Awaiter is the part of the confirm service's client that streams a
// challenge until it is decided or expires (ConfirmService.Await). When
// Config.Confirm is one, as the generated client is, a task learns the
// decision as it happens; otherwise it reads the challenge every
// pollInterval.
type Awaiter interface {
	Await(ctx context.Context, in *mandatev1.AwaitRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[mandatev1.Challenge], error)
}

var _ Awaiter = mandatev1.ConfirmServiceClient(nil)

// task is one MCP task.
type task struct {
	id      string
	owner   string // principalKey of its creator
	tool    string
	created time.Time
	ttl     time.Duration
	// challenge and approvalURL name what a waiting task waits for.
	challenge, approvalURL string

	cancel context.CancelFunc // ends the wait
	done   chan struct{}      // closed once terminal
	// modern marks a task of the 2026 extension (tasks2026.go), which
	// shows itself in that extension's shape.
	modern bool

	mu      sync.Mutex
	status  string
	message string
	updated time.Time
	result  *mcp.CallToolResult
	rpcErr  *jsonrpc.Error
	// p and token are the owner's newest credentials, with which the
	// approved call runs; fresh is signalled when they change.
	p     identity.Principal
	token string
	fresh chan struct{}
}

// taskStore holds a bridge's tasks.
type taskStore struct {
	mu       sync.Mutex
	byID     map[string]*task
	byOwner  map[string][]*task // in creation order
	reserved map[string]int     // task-augmented calls being served
}

func newTaskStore() *taskStore {
	return &taskStore{byID: map[string]*task{}, byOwner: map[string][]*task{}, reserved: map[string]int{}}
}

// taskReservation is one task-augmented call counted against its
// owner's cap while it is served: released when the call ends without a
// task, or taken over by the task it stores (add) — once, either way, so
// that a task is never counted both as waiting and as reserved.
type taskReservation struct {
	owner string
	done  atomic.Bool
}

// reserve counts a task-augmented call of owner unless its waiting tasks
// and those being created reach limit; nil when they do.
func (s *taskStore) reserve(owner string, limit int) *taskReservation {
	s.mu.Lock()
	defer s.mu.Unlock()
	waiting := s.reserved[owner]
	for _, t := range s.byOwner[owner] {
		if !t.terminal() {
			waiting++
		}
	}
	if waiting >= limit {
		return nil
	}
	s.reserved[owner]++
	return &taskReservation{owner: owner}
}

// release gives r back unless its task took it over. The caller holds
// no lock.
func (s *taskStore) release(r *taskReservation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drop(r)
}

// drop ends r once. The caller holds mu.
func (s *taskStore) drop(r *taskReservation) {
	if r == nil || !r.done.CompareAndSwap(false, true) {
		return
	}
	if s.reserved[r.owner]--; s.reserved[r.owner] <= 0 {
		delete(s.reserved, r.owner)
	}
}

// add stores t, taking over its call's reservation (held, nil for none)
// in the same step, drops the owner's oldest finished task past
// maxFinishedTasks, and deletes t once its ttl has passed.
func (s *taskStore) add(t *task, held *taskReservation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drop(held)
	s.byID[t.id] = t
	list := append(s.byOwner[t.owner], t)
	finished := 0
	for _, o := range list {
		if o.terminal() {
			finished++
		}
	}
	for i := 0; finished > maxFinishedTasks && i < len(list); {
		if list[i].terminal() {
			delete(s.byID, list[i].id)
			list = slices.Delete(list, i, i+1)
			finished--
			continue
		}
		i++
	}
	s.byOwner[t.owner] = list
	time.AfterFunc(t.ttl, func() { s.remove(t) })
}

func (s *taskStore) remove(t *task) {
	t.cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID[t.id] != t {
		return
	}
	delete(s.byID, t.id)
	list := slices.DeleteFunc(s.byOwner[t.owner], func(o *task) bool { return o == t })
	if len(list) == 0 {
		delete(s.byOwner, t.owner)
	} else {
		s.byOwner[t.owner] = list
	}
}

func (s *taskStore) get(id string) *task {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[id]
}

func (s *taskStore) list(owner string) []*task {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.byOwner[owner])
}

// closeAll ends every wait (Bridge.Close).
func (s *taskStore) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.byID {
		t.cancel()
	}
}

func (t *task) terminal() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// finish moves a working task to its terminal status, once: a cancelled
// task stays cancelled whatever its wait ends with.
func (t *task) finish(now time.Time, status, message string, res *mcp.CallToolResult, rpcErr *jsonrpc.Error) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.status != taskWorking && t.status != taskInputRequired {
		return false
	}
	t.status, t.message, t.updated, t.result, t.rpcErr = status, message, now, res, rpcErr
	close(t.done)
	return true
}

// credentials keeps the owner's token that expires last.
func (t *task) credentials(p identity.Principal, token string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if token == "" || t.token == token || (t.token != "" && p.ExpiresAt.Before(t.p.ExpiresAt)) {
		return
	}
	t.p, t.token = p, token
	select {
	case t.fresh <- struct{}{}:
	default:
	}
}

func (t *task) creds() (identity.Principal, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.p, t.token
}

// wire is the task as the protocol shows it.
func (t *task) wire(poll time.Duration) map[string]any {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := map[string]any{
		"taskId":        t.id,
		"status":        t.status,
		"createdAt":     t.created.UTC().Format(timeLayout),
		"lastUpdatedAt": t.updated.UTC().Format(timeLayout),
		"ttl":           t.ttl.Milliseconds(),
	}
	if t.message != "" {
		w["statusMessage"] = t.message
	}
	if t.status == taskWorking || t.status == taskInputRequired {
		w["pollInterval"] = poll.Milliseconds()
	}
	return w
}

// taskProbe rides in the context of a task-augmented call's first run:
// callTool leaves the call and its refusal there instead of asking for
// the confirmation itself.
type taskProbe struct {
	call    toolCall
	refused error
	// observe leaves the confirmation to callTool as usual (2026: the
	// form, as input_required, is resolved before any task).
	observe bool
}

type taskProbeKey struct{}

func probeOf(ctx context.Context) *taskProbe {
	tp, _ := ctx.Value(taskProbeKey{}).(*taskProbe)
	return tp
}

// createTaskResult is the CreateTaskResult of a task-augmented call.
type createTaskResult struct {
	mcp.ResultBase
	body []byte
}

func (r *createTaskResult) GetMeta() map[string]any      { return nil }
func (r *createTaskResult) SetMeta(map[string]any)       {}
func (r *createTaskResult) MarshalJSON() ([]byte, error) { return r.body, nil }

// callAsTask runs a task-augmented tools/call: the call runs now, as any
// call; a confirmation.required refusal becomes a task that waits for the
// human, any other answer a task that has ended with it.
func (b *Bridge) callAsTask(ctx context.Context, req *mcp.CallToolRequest, c *caller) (mcp.Result, error) {
	name := ""
	if req.Params != nil {
		name = req.Params.Name
	}
	if name == CheckTool || name == PlanTool {
		// Their descriptors do not offer tasks (execution.taskSupport
		// absent means forbidden).
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("%s does not run as a task", name)}
	}
	tp := &taskProbe{}
	res, err := b.callTool(context.WithValue(ctx, taskProbeKey{}, tp), req)
	if err != nil {
		return nil, err // not accepted: what the call itself is answered (unknown tool, …)
	}
	t, wctx := b.newTask(c, name)
	prob := failure.Problem(failure.ToStatus(tp.refused), "")
	waits := tp.refused != nil && b.cfg.Confirm != nil && tp.call.GrantID == "" &&
		prob.Code == failure.CodeConfirmationRequired && prob.ChallengeID != ""
	immediate := ""
	var form *mandatev1.Challenge // the challenge to put to the session's human
	if waits {
		ch := b.waitFor(ctx, t, c, prob, res)
		wantsForm, _ := elicitationModes(req.ClientCapabilities())
		if wantsForm && ch.GetElicitable() && req.Session != nil {
			form = ch
		}
		immediate = fmt.Sprintf("%s needs a human's approval; it runs once approved (task %s). %s", name, t.id, t.message)
	} else {
		t.ttl = TaskRetention
		t.result = res
		status := taskCompleted
		if res.IsError {
			status = taskFailed
		}
		t.status, t.message = status, ""
		close(t.done)
		t.cancel()
	}
	if waits && !b.goTracked(func() { b.awaitTask(wctx, t, tp.call, res, req.Session, form) }) {
		t.cancel()
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the bridge is shutting down"}
	}
	b.tasks.add(t, c.held)
	if waits {
		b.log.InfoContext(ctx, "mcpbridge: call waits for approval as a task", "tool", name, "task_id", t.id, "challenge_id", t.challenge)
	}
	out := map[string]any{"task": t.wire(b.taskPoll())}
	meta := map[string]any{}
	if immediate != "" {
		meta[metaImmediate] = immediate
		meta[MetaTaskChallenge] = t.challenge
	}
	if inv, _ := res.Meta[MetaInvocation].(string); inv != "" {
		meta[MetaInvocation] = inv
	}
	if len(meta) > 0 {
		out["_meta"] = meta
	}
	body, mErr := json.Marshal(out)
	if mErr != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "encoding the task"}
	}
	return &createTaskResult{body: body}, nil
}

// goTracked runs f in a goroutine Close waits for, unless the bridge is
// closed.
func (b *Bridge) goTracked(f func()) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
	return true
}

// newTask is a working task of c's, and the context of its wait.
func (b *Bridge) newTask(c *caller, tool string) (*task, context.Context) {
	now := b.now()
	t := &task{
		id: b.newTaskID(), owner: c.info.UserID, tool: tool, created: now, updated: now,
		status: taskWorking, done: make(chan struct{}), fresh: make(chan struct{}, 1), p: c.p, token: c.token,
	}
	var wctx context.Context
	wctx, t.cancel = context.WithCancel(b.ctx)
	return t, wctx
}

// waitFor makes t wait for the challenge of prob: its ttl (the
// challenge's lifetime and TaskRetention), its message, and the result
// tasks/result answers if it is cancelled (the confirmation.required
// refusal, which still names the challenge). It returns the challenge, or
// nil when it cannot be read.
func (b *Bridge) waitFor(ctx context.Context, t *task, c *caller, prob failure.ProblemBody, pending *mcp.CallToolResult) *mandatev1.Challenge {
	t.challenge, t.approvalURL = prob.ChallengeID, prob.ApprovalURL
	t.ttl = TaskRetention
	cctx := identity.WithRawToken(identity.WithPrincipal(ctx, c.p), c.token)
	ch, err := b.cfg.Confirm.Get(cctx, &mandatev1.ConfirmServiceGetRequest{ChallengeId: prob.ChallengeID})
	if err != nil {
		b.log.WarnContext(ctx, "mcpbridge: reading a task's challenge; the task waits for the approval page", "challenge_id", prob.ChallengeID, "error", err)
		ch = nil
	}
	if exp := ch.GetExpiresAt(); exp != nil && exp.AsTime().After(t.created) {
		t.ttl += exp.AsTime().Sub(t.created)
	} else {
		t.ttl += 24 * time.Hour // the longest a challenge stays open
	}
	t.message = waitingMessage(prob.ApprovalURL, prob.ChallengeID, prob.ApproverPermission)
	t.result = pending
	return ch
}

// waitingMessage is a waiting task's statusMessage.
func waitingMessage(approvalURL, challenge, permission string) string {
	who := "your user"
	if permission != "" {
		who = "another person holding " + permission
	}
	return fmt.Sprintf("Waiting for %s to approve or decline at %s (challenge %s).", who, approvalURL, challenge)
}

// askInTask puts a waiting task's challenge to the session's human as a
// confirmation form, where the call without a task would have been (the
// confirm service says the session may answer by form, and the client
// declared form elicitation): the task is input_required while the form
// is out, and the form is related to the task. The SDK sends it on the
// session's standalone stream, as it has no request to relate it to. The
// answer is recorded as for any form (accept approves, decline declines,
// channel mcp_elicitation); the task's wait then sees the decision. Cancel,
// or a form that fails, decides nothing: the challenge stays open at the
// approval URL and the task keeps waiting.
func (b *Bridge) askInTask(ctx context.Context, t *task, ss *mcp.ServerSession, c *mandatev1.Challenge) {
	b.setWaiting(t, taskInputRequired, "Waiting for your user to answer the confirmation form (or to decide at "+t.approvalURL+").")
	p, tok := t.creds()
	ctx = identity.WithRawToken(identity.WithPrincipal(ctx, p), tok)
	res, err := ss.Elicit(ctx, &mcp.ElicitParams{
		Meta: mcp.Meta{MetaChallenge: t.challenge, metaRelatedTask: map[string]string{"taskId": t.id}},
		Mode: "form", Message: FormMessage(c.GetPrompt()), RequestedSchema: approvalSchema,
	})
	switch {
	case ctx.Err() != nil:
		return // decided elsewhere, cancelled, or closing
	case err != nil:
		b.log.WarnContext(ctx, "mcpbridge: a task's confirmation form failed; the challenge stays open at the approval URL",
			"task_id", t.id, "challenge_id", t.challenge, "error", err)
	case res.Action == "accept" || res.Action == "decline":
		if err := b.decideElicited(ctx, t.challenge, res.Action == "accept"); err != nil && !isCode(err, failure.CodeConfirmationAlreadyDecided) {
			b.log.WarnContext(ctx, "mcpbridge: recording a task's form answer failed", "task_id", t.id, "challenge_id", t.challenge, "error", err)
		} else {
			b.setWaiting(t, taskWorking, "The confirmation form was answered; running the decision.")
			return
		}
	}
	b.setWaiting(t, taskWorking, "The confirmation form was dismissed or failed: nothing was decided. "+
		waitingMessage(t.approvalURL, t.challenge, ""))
}

// setWaiting changes a task that has not ended between working and
// input_required.
func (b *Bridge) setWaiting(t *task, status, message string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.status != taskWorking && t.status != taskInputRequired {
		return
	}
	t.status, t.message, t.updated = status, message, b.now()
}

func (b *Bridge) taskPoll() time.Duration {
	if b.cfg.TaskPollInterval > 0 {
		return b.cfg.TaskPollInterval
	}
	return DefaultTaskPollInterval
}

// awaitTask waits for a task's challenge to be decided or to expire, then
// runs the call again with the challenge as its grant: the executor runs
// it if it was approved, and refuses it (audited) otherwise.
func (b *Bridge) awaitTask(ctx context.Context, t *task, call toolCall, pending *mcp.CallToolResult, ss *mcp.ServerSession, form *mandatev1.Challenge) {
	cancelForm := func() {}
	if form != nil {
		var fctx context.Context
		fctx, cancelForm = context.WithCancel(ctx)
		defer cancelForm()
		b.goTracked(func() { b.askInTask(fctx, t, ss, form) })
	}
	c, ok := b.awaitDecision(ctx, t)
	cancelForm() // decided: a form still out goes
	if !ok {
		return // cancelled, or the bridge is closing
	}
	var status, message string
	switch c.GetState() {
	case mandatev1.ChallengeState_CHALLENGE_STATE_APPROVED, mandatev1.ChallengeState_CHALLENGE_STATE_REDEEMED:
		message = "Approved by " + c.GetDecidedBy() + "."
	case mandatev1.ChallengeState_CHALLENGE_STATE_DECLINED:
		message = "Declined by " + c.GetDecidedBy() + "; the call did not run."
	case mandatev1.ChallengeState_CHALLENGE_STATE_EXPIRED:
		message = "Nobody decided before the approval expired; the call did not run."
	default:
		message = "The challenge ended in state " + c.GetState().String() + "."
	}
	// The owner's token may have expired while the human took their time:
	// the call then waits for the next request of the owner (tasks/get,
	// tasks/result), which brings a current one.
	var p identity.Principal
	var tok string
	for {
		p, tok = t.creds()
		if p.ExpiresAt.IsZero() || b.now().Add(30*time.Second).Before(p.ExpiresAt) {
			break
		}
		b.setWaiting(t, taskWorking, message+" Waiting for a request of the client with a current token to run it.")
		select {
		case <-ctx.Done():
			return
		case <-t.fresh:
		}
	}
	rctx := identity.WithRawToken(identity.WithPrincipal(ctx, p), tok)
	call.GrantID = t.challenge
	var res *mcp.CallToolResult
	var rpcErr *jsonrpc.Error
	out, err := b.execute(rctx, call)
	if err != nil {
		r, rerr := b.refusal(rctx, call.Code, err)
		res = r
		if rerr != nil {
			if je, ok := errors.AsType[*jsonrpc.Error](rerr); ok {
				rpcErr = je
			} else {
				rpcErr = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: rerr.Error()}
			}
		}
	} else {
		res = b.result(rctx, nil, call, out)
	}
	switch {
	case rpcErr != nil || (res.IsError && !t.modern): // 2026: failed is for JSON-RPC errors alone
		status = taskFailed
		if res != nil {
			if ref, ok := res.Meta[MetaRefusal].(json.RawMessage); ok {
				var r Refusal
				if json.Unmarshal(ref, &r) == nil && r.Code != "" {
					message += " The executor answered " + r.Code + "."
				}
			}
		}
	default:
		status = taskCompleted
	}
	if rpcErr == nil && !res.IsError {
		message += " The call ran with the grant, through every stage of the pipeline."
	}
	if res == nil {
		res = pending
	}
	if t.finish(b.now(), status, message, res, rpcErr) {
		b.log.InfoContext(ctx, "mcpbridge: task ended", "task_id", t.id, "tool", call.Code, "challenge_id", t.challenge, "status", status)
	}
}

// awaitDecision returns the task's challenge once it is no longer
// pending: from ConfirmService.Await when the confirm client offers it,
// else by reading it every pollInterval. Broken streams are opened again
// with backoff. It returns false when ctx ends first.
func (b *Bridge) awaitDecision(ctx context.Context, t *task) (*mandatev1.Challenge, bool) {
	aw, streams := b.cfg.Confirm.(Awaiter)
	backoff := 250 * time.Millisecond
	for {
		p, tok := t.creds()
		cctx := identity.WithRawToken(identity.WithPrincipal(ctx, p), tok)
		var c *mandatev1.Challenge
		var err error
		if streams {
			c, err = awaitStream(cctx, aw, t.challenge)
		} else {
			c, err = b.cfg.Confirm.Get(cctx, &mandatev1.ConfirmServiceGetRequest{ChallengeId: t.challenge})
		}
		if err == nil && c.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_PENDING &&
			c.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_UNSPECIFIED {
			return c, true
		}
		wait := b.taskPoll()
		if err != nil {
			if ctx.Err() == nil {
				b.log.WarnContext(ctx, "mcpbridge: awaiting a task's challenge", "task_id", t.id, "challenge_id", t.challenge, "error", err)
			}
			wait, backoff = backoff, min(backoff*2, 10*time.Second)
		} else {
			backoff = 250 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return nil, false
		case <-time.After(wait):
		}
	}
}

// awaitStream follows the challenge on ConfirmService.Await until it is
// no longer pending or the stream ends.
func awaitStream(ctx context.Context, aw Awaiter, id string) (*mandatev1.Challenge, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := aw.Await(ctx, &mandatev1.AwaitRequest{ChallengeId: id})
	if err != nil {
		return nil, err
	}
	var last *mandatev1.Challenge
	for {
		c, err := st.Recv()
		if err != nil {
			if last != nil {
				return last, nil
			}
			return nil, err
		}
		last = c
		if c.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_PENDING {
			return c, nil
		}
	}
}

// serveTasks is the bridge's part of the tasks protocol on the HTTP
// request, where the SDK would drop or refuse it: a tools/call with
// `task` is marked on the request's caller (after the per-principal cap,
// task.too_many), and tasks/get, tasks/result, tasks/list and tasks/cancel
// of a session of the caller's are answered here. Everything else, and
// every sessionless (2026-07-28) request, passes untouched.
func (b *Bridge) serveTasks(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rb, ok := r.Body.(*replayBody)
		if r.Method != http.MethodPost || !ok || rb.limited.N <= 0 {
			next.ServeHTTP(w, r)
			return
		}
		stateless := len(b.cfg.StateKey) > 0 && statelessRequest(r)
		body := rb.buf.Bytes()
		if !bytes.Contains(body, []byte(`"task`)) {
			next.ServeHTTP(w, r)
			return
		}
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		}
		c, authed := verifiedCaller(auth.TokenInfoFromContext(r.Context()))
		if !authed || json.Unmarshal(body, &msg) != nil || len(msg.ID) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		if stateless {
			// The 2026 extension (tasks2026.go); its task-augmented calls
			// need nothing here.
			switch msg.Method {
			case "tasks/get", "tasks/update", "tasks/cancel":
				b.answerTask2026(w, r, c, msg.ID, msg.Method, msg.Params)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		switch msg.Method {
		case "tasks/get", "tasks/result", "tasks/list", "tasks/cancel":
			session := r.Header.Get(sessionHeader)
			taskID := taskIDOf(msg.Params)
			// A replica forwards a request for one of this replica's tasks
			// made in a session of its own (forwardToTaskOwner), without the
			// session.
			viaPeer := session == "" && taskID != "" && b.fromTaskPeer(r, taskID)
			if !viaPeer && (session == "" || !b.ownsSession(c.info.UserID, session)) {
				next.ServeHTTP(w, r) // the SDK answers as for any request without a session of the caller's
				return
			}
			if !viaPeer && msg.Method != "tasks/list" && b.forwardToTaskOwner(w, r, taskID) {
				return
			}
			b.answerTask(w, r, c, session, msg.ID, msg.Method, msg.Params)
			return
		case "tools/call":
			var p struct {
				Task *taskRequest `json:"task"`
			}
			if json.Unmarshal(msg.Params, &p) != nil || p.Task == nil || r.Header.Get(sessionHeader) == "" {
				break
			}
			key := c.info.UserID
			held := b.tasks.reserve(key, b.cfg.MaxTasks)
			if held == nil {
				e := failure.New(failure.StageRequest, failure.CodeTaskTooMany,
					"this caller already has "+strconv.Itoa(b.cfg.MaxTasks)+" MCP tasks waiting for a human; wait for one to end or cancel one (tasks/cancel)")
				b.refuseAtEdge(w, c, r.Header.Get(sessionHeader), e, time.Minute)
				return
			}
			defer b.tasks.release(held)
			c.task, c.held = p.Task, held
		}
		next.ServeHTTP(w, r)
	})
}

// ownsSession reports whether session is open on key's server.
func (b *Bridge) ownsSession(key, session string) bool {
	b.mu.Lock()
	e := b.servers[key]
	b.mu.Unlock()
	if e == nil {
		return false
	}
	for ss := range e.srv.Sessions() {
		if ss.ID() == session {
			return true
		}
	}
	return false
}

// answerTask answers tasks/get, tasks/result, tasks/list or tasks/cancel.
func (b *Bridge) answerTask(w http.ResponseWriter, r *http.Request, c *caller, session string, id json.RawMessage, method string, params json.RawMessage) {
	var p struct {
		TaskID string  `json:"taskId"`
		Cursor *string `json:"cursor"`
	}
	if len(params) > 0 && json.Unmarshal(params, &p) != nil {
		writeRPC(w, id, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "invalid params"})
		return
	}
	poll := b.taskPoll()
	if method == "tasks/list" {
		if p.Cursor != nil {
			writeRPC(w, id, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "invalid cursor: the list has one page"})
			return
		}
		list := []map[string]any{}
		for _, t := range b.tasks.list(c.info.UserID) {
			if !t.modern {
				list = append(list, t.wire(poll))
			}
		}
		writeRPC(w, id, map[string]any{"tasks": list}, nil)
		return
	}
	t := b.tasks.get(p.TaskID)
	if t != nil && t.modern && t.owner == c.info.UserID {
		t = nil // a task of the 2026 extension is not one of this revision
	}
	if t == nil || t.owner != c.info.UserID {
		if t != nil {
			// Another principal's task: the same answer as an unknown id,
			// and a row in the trail.
			b.cfg.EdgeRecorder.Record(edgelimit.Refusal{Principal: c.p, Channel: contract.ChannelMCP, Code: failure.CodeTaskNotFound,
				Message: method + " named a task of another principal", Session: session})
			b.log.WarnContext(r.Context(), "mcpbridge: a task asked for by another principal", "method", method, "task_id", t.id)
		}
		writeRPC(w, id, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "task not found"})
		return
	}
	t.credentials(c.p, c.token)
	switch method {
	case "tasks/get":
		writeRPC(w, id, t.wire(poll), nil)
	case "tasks/cancel":
		if !t.finish(b.now(), taskCancelled, cancelledMessage(t), t.result, nil) {
			writeRPC(w, id, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "the task has already ended"})
			return
		}
		t.cancel()
		writeRPC(w, id, t.wire(poll), nil)
	case "tasks/result":
		// Blocks until the task ends: the headers go out now, the body
		// when it is known.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).Flush()
		select {
		case <-t.done:
		case <-r.Context().Done():
			return
		case <-b.ctx.Done():
			writeRPCBody(w, id, nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the bridge is shutting down; the task ended with it"})
			return
		}
		t.mu.Lock()
		res, rpcErr := t.result, t.rpcErr
		t.mu.Unlock()
		if rpcErr != nil {
			writeRPCBody(w, id, nil, rpcErr)
			return
		}
		out := *res
		meta := make(mcp.Meta, len(res.Meta)+1)
		for k, v := range res.Meta {
			meta[k] = v
		}
		meta[metaRelatedTask] = map[string]string{"taskId": t.id}
		out.Meta = meta
		writeRPCBody(w, id, &out, nil)
	}
}

// writeRPC answers one JSON-RPC response as JSON.
func writeRPC(w http.ResponseWriter, id json.RawMessage, result any, rpcErr *jsonrpc.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	writeRPCBody(w, id, result, rpcErr)
}

func writeRPCBody(w http.ResponseWriter, id json.RawMessage, result any, rpcErr *jsonrpc.Error) {
	msg := map[string]any{"jsonrpc": "2.0", "id": id}
	if rpcErr != nil {
		e := map[string]any{"code": rpcErr.Code, "message": rpcErr.Message}
		if len(rpcErr.Data) > 0 {
			e["data"] = rpcErr.Data
		}
		msg["error"] = e
	} else {
		msg["result"] = result
	}
	body, err := json.Marshal(msg)
	if err != nil {
		body = []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"encoding the answer"}}`)
	}
	_, _ = w.Write(body)
}

// tasksResult is an initialize or tools/list result of a 2025-11-25
// session with the tasks protocol spliced in.
type tasksResult struct {
	mcp.ResultBase
	res  mcp.Result
	tool func(name string) bool // tools/list: which tools offer tasks
	// extension: server/discover, which names the 2026 extension.
	extension bool
}

func (r *tasksResult) GetMeta() map[string]any  { return r.res.GetMeta() }
func (r *tasksResult) SetMeta(m map[string]any) { r.res.SetMeta(m) }

// serverTasksCapability is what the bridge declares: task-augmented
// tools/call, tasks/list and tasks/cancel.
var serverTasksCapability = json.RawMessage(`{"list":{},"cancel":{},"requests":{"tools":{"call":{}}}}`)

func (r *tasksResult) MarshalJSON() ([]byte, error) {
	body, err := json.Marshal(r.res)
	if err != nil {
		return nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, err
	}
	if r.tool == nil {
		var caps map[string]json.RawMessage
		if err := json.Unmarshal(top["capabilities"], &caps); err != nil {
			return nil, err
		}
		if caps == nil {
			caps = map[string]json.RawMessage{}
		}
		if r.extension {
			var ext map[string]json.RawMessage
			if raw := caps["extensions"]; len(raw) > 0 {
				if err := json.Unmarshal(raw, &ext); err != nil {
					return nil, err
				}
			}
			if ext == nil {
				ext = map[string]json.RawMessage{}
			}
			ext[ExtensionTasks] = json.RawMessage(`{}`)
			if caps["extensions"], err = json.Marshal(ext); err != nil {
				return nil, err
			}
		} else {
			caps["tasks"] = serverTasksCapability
		}
		if top["capabilities"], err = json.Marshal(caps); err != nil {
			return nil, err
		}
		return json.Marshal(top)
	}
	var tools []map[string]json.RawMessage
	if err := json.Unmarshal(top["tools"], &tools); err != nil {
		return body, nil //nolint:nilerr // nothing to splice into
	}
	for _, t := range tools {
		var name string
		if json.Unmarshal(t["name"], &name) == nil && r.tool(name) {
			t["execution"] = json.RawMessage(`{"taskSupport":"optional"}`)
		}
	}
	if top["tools"], err = json.Marshal(tools); err != nil {
		return nil, err
	}
	return json.Marshal(top)
}

// spliceTasks adds the tasks protocol to an initialize or tools/list
// result of a 2025-11-25 session; other results pass unchanged.
func (b *Bridge) spliceTasks(method string, req mcp.Request, res mcp.Result) mcp.Result {
	switch method {
	case "initialize":
		if ir, ok := res.(*mcp.InitializeResult); ok && ir.ProtocolVersion == ProtocolTasks {
			return &tasksResult{res: res}
		}
	case "server/discover":
		if b.cfg.Confirm != nil {
			return &tasksResult{res: res, extension: true}
		}
	case "tools/list":
		ss, ok := req.GetSession().(*mcp.ServerSession)
		if !ok || ss == nil {
			return res
		}
		if ip := ss.InitializeParams(); ip == nil || ip.ProtocolVersion != ProtocolTasks {
			return res
		}
		return &tasksResult{res: res, tool: func(name string) bool { return name != CheckTool && name != PlanTool }}
	}
	return res
}
