package executor

import (
	"slices"
	"testing"
)

// TestPipelineOrder asserts the constraints the pipeline's order carries:
// authenticate first; the request's own attributes checked before the
// command is even looked up; permission before the arguments are parsed
// (a caller who may not run a command learns nothing about its schema)
// and before a human is asked; idempotency before a human is asked (an
// approval is never spent on a retry the key answers); the audit intent
// immediately before dispatch (nothing is dispatched without it); dispatch
// last, and the only stage that settles the reservation itself.
func TestPipelineOrder(t *testing.T) {
	names := make([]string, len(pipeline))
	for i, s := range pipeline {
		names[i] = s.name
		if s.run == nil {
			t.Fatalf("stage %s has no body", s.name)
		}
	}
	at := func(name string) int {
		i := slices.Index(names, name)
		if i < 0 {
			t.Fatalf("the pipeline %v lacks %s", names, name)
		}
		return i
	}
	before := func(a, b string) {
		if at(a) >= at(b) {
			t.Errorf("%s must come before %s: %v", a, b, names)
		}
	}
	if names[0] != StageAuthenticate {
		t.Errorf("the pipeline starts with %s, not authenticate", names[0])
	}
	before(StageRequest, StageLoad)
	before(StageLoad, StageEntitlement)
	before(StageEntitlement, StagePermission)
	before(StagePermission, StageSchema)
	before(StagePermission, StageConfirmation)
	before(StageSchema, StageIdempotency)
	before(StageIdempotency, StageConfirmation)
	before(StageSoD, StageConfirmation)
	// Conditions read the decoded request, and decide whether a human is
	// asked (or refuse before anyone is).
	before(StageSchema, StageCondition)
	before(StagePermission, StageCondition)
	before(StageCondition, StageConfirmation)
	// Limits spend after the key is reserved (a replay never spends) and
	// after the conditions (a denied call never spends), and before a
	// human is asked (a limit may escalate the call to one).
	before(StageIdempotency, StageBudget)
	before(StageCondition, StageBudget)
	before(StageSoD, StageBudget)
	before(StageBudget, StageConfirmation)
	if at(StageAudit)+1 != at(StageDispatch) {
		t.Errorf("the audit intent is not immediately before dispatch: %v", names)
	}
	if last := pipeline[len(pipeline)-1]; last.name != StageDispatch || !last.settles {
		t.Errorf("the last stage is %s (settles %v), want dispatch", last.name, last.settles)
	}
	for _, s := range pipeline[:len(pipeline)-1] {
		if s.settles {
			t.Errorf("%s settles the reservation, but only dispatch may", s.name)
		}
	}
	// Check mode: every stage with an effect has a check of its own that
	// decides without it (a reservation, a challenge, the intent, the
	// dispatch); the others only read.
	for _, s := range pipeline {
		effect := slices.Contains([]string{StageIdempotency, StageBudget, StageConfirmation, StageAudit, StageDispatch}, s.name)
		if effect && s.check == nil {
			t.Errorf("%s has an effect and no check: Executor.Check would run it", s.name)
		}
		if !effect && s.check != nil {
			t.Errorf("%s has a check of its own, but is listed as a stage without effect", s.name)
		}
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			t.Errorf("stage %s runs twice", n)
		}
		seen[n] = true
	}
}
