// Package simulate replays the attempts an audit trail recorded through a
// candidate policy and manifest, and reports which calls would newly be
// refused, newly need a human's approval, or newly pass
// (`mandate policy simulate`, docs/policy-simulate.md).
//
// Each attempt runs through the executor's own pipeline in check mode
// (Executor.Check) — the same stages, in the same order, as a real call —
// with the principal the trail recorded, against an in-memory directory
// holding the candidate policy. Nothing has an effect: no key is
// reserved, no challenge opened, no backend asked, and the check rows the
// pipeline writes go nowhere.
//
// What a replay cannot know is reported, never guessed: an argument the
// trail withheld (a sensitive field) cannot be replayed exactly, a
// refusal at a stage no policy decides (a malformed request, a key in
// flight, the trail unavailable, the backend's own refusal) has no policy
// verdict to compare, and separation of duties, which depends on who did
// what before, is decided on an empty history.
package simulate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/schema"
	"github.com/mandate-dev/mandate/services/executor"
	execmem "github.com/mandate-dev/mandate/services/executor/memory"
)

// Row is what the simulation reads of one audit row.
type Row struct {
	InvocationID string
	// Phase is intent, outcome, check, decision or resolution; only intent
	// and outcome rows are attempts.
	Phase     string
	Time      time.Time
	Tenant    string
	Channel   string
	Command   string
	UserID    string
	ActorKind string
	AgentID   string
	Model     string
	// Approved is set when a human approved the call.
	Approved bool
	Outcome  string
	Stage    string
	Code     string
	// Arguments is the call's input as the trail holds it, sensitive
	// values withheld.
	Arguments json.RawMessage
}

// Verdict is what a policy decided of a call.
type Verdict string

// The verdicts an attempt can have.
const (
	Allowed          Verdict = "allowed"
	ApprovalRequired Verdict = "approval_required"
	Refused          Verdict = "refused"
)

// Change names how an attempt's verdict moved.
type Change string

// The changes reported; an attempt whose verdict did not move is unchanged.
const (
	NewlyRefused       Change = "newly_refused"
	NewlyNeedsApproval Change = "newly_needs_approval"
	NewlyPasses        Change = "newly_passes"
)

// Skip says why an attempt was not replayed.
type Skip string

// The reasons an attempt is not replayed.
const (
	// SkipUnauthenticated: the trail knows no principal to replay it as.
	SkipUnauthenticated Skip = "unauthenticated"
	// SkipNotPolicy: the recorded refusal came from a stage no policy
	// decides, so the call's policy verdict was never reached.
	SkipNotPolicy Skip = "refused_outside_policy"
	// SkipWithheld: the verdict turned on arguments the trail withheld.
	SkipWithheld Skip = "arguments_withheld"
)

// policyStages are the stages whose refusals a policy or manifest decides:
// a recorded refusal at any other stage says nothing about the policy.
var policyStages = map[string]bool{
	executor.StageAuthenticate: true, executor.StageLoad: true, executor.StageEntitlement: true,
	executor.StagePermission: true, executor.StageSchema: true, executor.StageScope: true,
	executor.StageSoD: true, executor.StageCondition: true, executor.StageConfirmation: true,
}

// Decision is one side of an attempt: its verdict, and the stage and code
// of a refusal or of the confirmation it needs.
type Decision struct {
	Verdict Verdict `json:"verdict"`
	Stage   string  `json:"stage,omitempty"`
	Code    string  `json:"code,omitempty"`
}

func (d Decision) String() string {
	if d.Verdict == Allowed {
		return string(d.Verdict)
	}
	return fmt.Sprintf("%s at %s (%s)", d.Verdict, d.Stage, d.Code)
}

// Attempt is one replayed attempt whose verdict changed.
type Attempt struct {
	InvocationID string    `json:"invocation_id"`
	Time         time.Time `json:"time"`
	Tenant       string    `json:"tenant"`
	Command      string    `json:"command"`
	Actor        string    `json:"actor"`
	UserID       string    `json:"user_id"`
	Change       Change    `json:"change"`
	Was          Decision  `json:"was"`
	Now          Decision  `json:"now"`
	// Approximate is set when the trail withheld some of the call's
	// arguments: the verdict did not turn on them, but a condition
	// reading one saw the placeholder.
	Approximate bool `json:"approximate,omitempty"`
}

// Report is the simulation's answer.
type Report struct {
	// Attempts is how many attempts the rows held; Replayed how many ran
	// through the candidate.
	Attempts, Replayed int
	// Changed are the attempts whose verdict moved, oldest first.
	Changed []Attempt
	// Unchanged counts replayed attempts whose verdict stayed.
	Unchanged int
	// Skipped counts the attempts not replayed, by reason.
	Skipped map[Skip]int
}

// Count returns how many changed attempts moved by c.
func (r *Report) Count(c Change) int {
	n := 0
	for _, a := range r.Changed {
		if a.Change == c {
			n++
		}
	}
	return n
}

// Candidate is the policy and manifest the attempts are replayed through.
type Candidate struct {
	Manifest *manifest.Set
	Policy   directory.Policy
	// ConfirmSideEffects is the deployment's --confirm-side-effects.
	ConfirmSideEffects bool
}

// Run replays the attempts in rows (any order; rows of one invocation are
// grouped) through the candidate.
func Run(ctx context.Context, rows []Row, c Candidate) (*Report, error) {
	if c.Manifest == nil {
		return nil, errors.New("simulate: a manifest is required")
	}
	dir := dirmem.New()
	if _, err := directory.ApplyPolicy(ctx, dir, c.Policy); err != nil {
		return nil, fmt.Errorf("simulate: loading the candidate policy: %w", err)
	}
	store := execmem.New(execmem.Options{})
	ex, err := executor.New(executor.Config{
		Manifest: c.Manifest, Directory: directory.Direct(dir),
		Audit: discard{}, Confirm: noConfirm{}, Dispatcher: noDispatch{}, Store: store,
		ConfirmSideEffects: c.ConfirmSideEffects,
		Logger:             slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	defer ex.Close()

	rep := &Report{Skipped: map[Skip]int{}}
	for _, at := range attempts(rows) {
		rep.Attempts++
		was, ok := recorded(at)
		switch {
		case at.first.UserID == "" || at.first.ActorKind == "":
			rep.Skipped[SkipUnauthenticated]++
			continue
		case !ok:
			rep.Skipped[SkipNotPolicy]++
			continue
		}
		now, withheld, err := replay(ctx, ex, c.Manifest, at, was)
		if err != nil {
			return nil, err
		}
		if withheld && (now.Stage == executor.StageSchema || now.Code == failure.CodeConditionEvaluationFailed) && now != was {
			// The placeholder, not the policy, decided.
			rep.Skipped[SkipWithheld]++
			continue
		}
		rep.Replayed++
		change, moved := compare(was, now)
		if !moved {
			rep.Unchanged++
			continue
		}
		rep.Changed = append(rep.Changed, Attempt{
			InvocationID: at.first.InvocationID, Time: at.first.Time, Tenant: at.first.Tenant,
			Command: at.first.Command, Actor: actor(at.first), UserID: at.first.UserID,
			Change: change, Was: was, Now: now, Approximate: withheld,
		})
	}
	slices.SortStableFunc(rep.Changed, func(a, b Attempt) int { return a.Time.Compare(b.Time) })
	return rep, nil
}

// attempt is the rows of one invocation.
type attempt struct {
	first Row
	rows  []Row
}

// attempts groups the intent and outcome rows by invocation, oldest first.
func attempts(rows []Row) []*attempt {
	by := map[string]*attempt{}
	var out []*attempt
	for _, r := range rows {
		if r.Phase != "intent" && r.Phase != "outcome" {
			continue
		}
		key := r.Tenant + "\x00" + r.InvocationID
		a := by[key]
		if a == nil {
			a = &attempt{first: r}
			by[key] = a
			out = append(out, a)
		}
		if r.Time.Before(a.first.Time) {
			a.first.Time = r.Time
		}
		a.rows = append(a.rows, r)
	}
	slices.SortStableFunc(out, func(a, b *attempt) int { return a.first.Time.Compare(b.first.Time) })
	return out
}

// recorded is the verdict the trail holds for an attempt, and false when
// its refusal came from a stage no policy decides.
func recorded(a *attempt) (Decision, bool) {
	var refusal *Row
	for i := range a.rows {
		r := &a.rows[i]
		if r.Approved {
			return Decision{Verdict: ApprovalRequired, Stage: executor.StageConfirmation, Code: failure.CodeConfirmationRequired}, true
		}
		if r.Phase == "outcome" && r.Outcome == "refused" {
			refusal = r
		}
	}
	if refusal == nil {
		// An intent, or an outcome of a call that was dispatched (executed,
		// failed, unknown) or replayed: every policy stage let it through.
		return Decision{Verdict: Allowed}, true
	}
	switch {
	case refusal.Stage == executor.StageConfirmation:
		// The stage refuses only a call that needs a human — not yet
		// approved, declined, expired, a grant for another call: whatever
		// the human did, the policy's verdict was "ask one".
		return Decision{Verdict: ApprovalRequired, Stage: refusal.Stage, Code: failure.CodeConfirmationRequired}, true
	case policyStages[refusal.Stage]:
		return Decision{Verdict: Refused, Stage: refusal.Stage, Code: refusal.Code}, true
	}
	return Decision{}, false
}

// replay runs the attempt through the candidate in check mode.
func replay(ctx context.Context, ex *executor.Executor, set *manifest.Set, a *attempt, was Decision) (Decision, bool, error) {
	r := a.first
	input := []byte(r.Arguments)
	if len(input) == 0 {
		input = []byte("{}")
	}
	withheld := strings.Contains(string(input), `"`+schema.Withheld+`"`)
	if withheld {
		input = standIn(input, examplesOf(set, r.Command))
	}
	p := identity.Principal{Kind: identity.Kind(r.ActorKind), Tenant: r.Tenant, UserID: r.UserID, AgentID: r.AgentID, Model: r.Model}
	if p.Kind == identity.KindService {
		p.ServiceName, p.UserID = r.UserID, ""
	}
	call := executor.Call{Code: r.Command, Input: input, Channel: r.Channel, Tenant: r.Tenant}
	if was.Stage != executor.StageIdempotency {
		// The trail does not keep the key; a fresh one stands in for it,
		// so a command that requires one finds one.
		call.IdempotencyKey = "simulate-" + r.InvocationID
	}
	v, err := ex.Check(identity.WithPrincipal(ctx, p), call)
	if err != nil {
		return Decision{}, false, fmt.Errorf("simulate: checking %s: %w", r.InvocationID, err)
	}
	d := Decision{Verdict: Allowed}
	switch v.Verdict {
	case mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED:
		d = Decision{Verdict: ApprovalRequired, Stage: executor.StageConfirmation, Code: failure.CodeConfirmationRequired}
	case mandatev1.Verdict_VERDICT_REFUSED:
		d = Decision{Verdict: Refused, Stage: v.Reason.Stage, Code: v.Reason.Code}
	}
	return d, withheld, nil
}

// examplesOf is the declared example inputs of a command, decoded.
func examplesOf(set *manifest.Set, code string) []any {
	var out []any
	for _, c := range set.Commands() {
		if c.Code != code {
			continue
		}
		for _, e := range c.Examples {
			var v any
			if json.Unmarshal(e.Input, &v) == nil {
				out = append(out, v)
			}
		}
	}
	return out
}

// standIn replaces each value the trail withheld by the value a declared
// example gives the same field (an array's element by the example's
// element at the same index, else its first): a sensitive field is
// usually validated (a pattern, a length), and its placeholder would be
// refused where the real value passed. A value no example gives stays
// withheld.
func standIn(input []byte, examples []any) []byte {
	var doc any
	if len(examples) == 0 || json.Unmarshal(input, &doc) != nil {
		return input
	}
	var fill func(v any, alts []any) any
	fill = func(v any, alts []any) any {
		switch x := v.(type) {
		case string:
			if x == schema.Withheld {
				for _, a := range alts {
					if a != nil {
						return a
					}
				}
			}
		case map[string]any:
			for k, child := range x {
				var sub []any
				for _, a := range alts {
					if m, ok := a.(map[string]any); ok {
						sub = append(sub, m[k])
					}
				}
				x[k] = fill(child, sub)
			}
		case []any:
			for i, child := range x {
				var sub []any
				for _, a := range alts {
					if l, ok := a.([]any); ok && len(l) > 0 {
						sub = append(sub, l[min(i, len(l)-1)])
					}
				}
				x[i] = fill(child, sub)
			}
		}
		return v
	}
	out, err := json.Marshal(fill(doc, examples))
	if err != nil {
		return input
	}
	return out
}

// compare says how the verdict moved from was to now.
func compare(was, now Decision) (Change, bool) {
	switch {
	case was.Verdict == now.Verdict:
		return "", false
	case now.Verdict == Refused:
		return NewlyRefused, true
	case now.Verdict == ApprovalRequired:
		return NewlyNeedsApproval, true
	default:
		return NewlyPasses, true
	}
}

func actor(r Row) string {
	if r.ActorKind == string(identity.KindAgent) {
		return "agent:" + r.AgentID
	}
	return r.ActorKind + ":" + r.UserID
}

// discard takes the check rows the pipeline writes and keeps none.
type discard struct{}

func (discard) Append(_ context.Context, in *mandatev1.AppendRequest, _ ...grpc.CallOption) (*mandatev1.AppendResponse, error) {
	return &mandatev1.AppendResponse{}, nil
}

// errNoEffects is the answer of every part a check never uses.
var errNoEffects = errors.New("simulate: a simulation has no effects")

// noConfirm is the confirm service of a simulation: no grant exists, and
// nothing is opened.
type noConfirm struct{}

func (noConfirm) Open(context.Context, *mandatev1.OpenRequest, ...grpc.CallOption) (*mandatev1.Challenge, error) {
	return nil, errNoEffects
}

func (noConfirm) Redeem(context.Context, *mandatev1.RedeemRequest, ...grpc.CallOption) (*mandatev1.Grant, error) {
	return nil, errNoEffects
}

func (noConfirm) Release(context.Context, *mandatev1.ReleaseRequest, ...grpc.CallOption) (*mandatev1.Challenge, error) {
	return nil, errNoEffects
}

func (noConfirm) Get(context.Context, *mandatev1.ConfirmServiceGetRequest, ...grpc.CallOption) (*mandatev1.Challenge, error) {
	return nil, errNoEffects
}

// noDispatch is the backend of a simulation: none is asked, not even for a
// preview (it implements no Previewer).
type noDispatch struct{}

func (noDispatch) Dispatch(context.Context, executor.Dispatch) (executor.Reply, error) {
	return executor.Reply{}, fmt.Errorf("%w: %w", executor.ErrNotSent, errNoEffects)
}
