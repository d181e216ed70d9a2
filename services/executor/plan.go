package executor

import (
	"context"
	"strings"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// Plan answers "what may I do now?" for p: each command p may call
// (directory.Resolution.MayCall, the catalog's rule and the pipeline's),
// in the manifest's order, with whether a call waits for a human's
// approval and who approves. It takes no arguments, so what they decide
// is named (DependsOn), not decided. It has no effect and writes no audit
// row, as a tool list does not.
func (e *Executor) Plan(ctx context.Context, p identity.Principal) ([]*mandatev1.PlanEntry, error) {
	if p.Tenant == "" || p.UserID == "" {
		return nil, failure.New(StageAuthenticate, failure.CodeAuthenticationMissingCredentials, "a user or an agent acting for a user must ask")
	}
	res, err := e.activeResolution(ctx, p, StageAuthenticate)
	if err != nil {
		return nil, err
	}
	var out []*mandatev1.PlanEntry
	for _, cmd := range e.cfg.Manifest.Commands() {
		if !res.MayCall(cmd) {
			continue
		}
		entry := &mandatev1.PlanEntry{Command: cmd.Code, Title: cmd.DisplayName, Risk: cmd.Risk,
			Verdict: mandatev1.Verdict_VERDICT_ALLOWED, DependsOn: dependsOn(cmd)}
		if cmd.ConfirmationRequired || (e.cfg.ConfirmSideEffects && len(cmd.SideEffects) > 0) {
			entry.Verdict = mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED
		}
		if cmd.Approver.Kind == manifest.ApproverPermissionHolder && (entry.Verdict == mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED || asksByCondition(cmd)) {
			entry.ApproverPermission = cmd.Approver.Permission
		}
		if len(cmd.Limits) > 0 {
			if entry.Limits, err = e.planLimits(ctx, cmd.Code, p, res.Limits); err != nil {
				return nil, failure.Wrap(StageBudget, failure.CodeBudgetUnavailable, "the store that counts the commands' limits could not be read", err)
			}
		}
		out = append(out, entry)
	}
	return out, nil
}

// asksByCondition reports whether a declared condition, or a limit that
// escalates, may ask a human.
func asksByCondition(cmd *manifest.Command) bool {
	for _, c := range cmd.Conditions {
		if c.Effect == "REQUIRE_CONFIRMATION" {
			return true
		}
	}
	for _, l := range cmd.Limits {
		if l.WhenExhausted == manifest.LimitExhaustEscalate {
			return true
		}
	}
	return false
}

// dependsOn says in words what a call's arguments or its subject's history
// decide beyond the plan: the declared conditions and separation of
// duties, and the declared limits.
func dependsOn(cmd *manifest.Command) []string {
	var out []string
	for _, c := range cmd.Conditions {
		switch c.Effect {
		case "REQUIRE_CONFIRMATION":
			out = append(out, c.Description+" (condition "+c.ID+", asks a human)")
		case "DENY":
			out = append(out, c.Description+" (condition "+c.ID+", refuses)")
		}
	}
	for _, l := range cmd.Limits {
		out = append(out, l.Describe())
	}
	if sod := cmd.SeparationOfDuties; sod != nil && len(sod.ConflictsWith) > 0 {
		out = append(out, "refused for a "+sod.Field+" on which the same user already ran "+strings.Join(sod.ConflictsWith, " or ")+" (separation of duties)")
	}
	return out
}
