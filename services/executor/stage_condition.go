package executor

import (
	"context"
	"fmt"
	"strings"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/condition"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// compiledCondition is one declared condition with its program.
type compiledCondition struct {
	manifest.Condition
	prg *condition.Program
}

// compileConditions compiles every command's declared conditions once,
// when the executor is built over its manifest: a call evaluates the
// programs, never compiles. A condition the build accepted compiles here
// too; one that does not (a manifest not built by protoc-gen-mandate) stops
// the executor from starting rather than run the command unguarded.
func compileConditions(set *manifest.Set) (map[string][]compiledCondition, error) {
	out := map[string][]compiledCondition{}
	envs := map[string]*condition.Env{}
	for _, c := range set.Commands() {
		if len(c.Conditions) == 0 {
			continue
		}
		md, ok := set.Method(c.Code)
		if !ok {
			return nil, fmt.Errorf("executor: conditions of %s: the command has no method", c.Code)
		}
		env := envs[c.RPC.InputType]
		if env == nil {
			var err error
			if env, err = condition.NewEnv(set.Files(), md.Input()); err != nil {
				return nil, fmt.Errorf("executor: conditions of %s: %w", c.Code, err)
			}
			envs[c.RPC.InputType] = env
		}
		for _, cd := range c.Conditions {
			if cd.Effect != condition.EffectDeny && cd.Effect != condition.EffectRequireConfirmation {
				return nil, fmt.Errorf("executor: condition %s of %s has no known effect (%q)", cd.ID, c.Code, cd.Effect)
			}
			prg, err := env.Compile(cd.Expression)
			if err != nil {
				return nil, fmt.Errorf("executor: condition %s of %s: %w", cd.ID, c.Code, err)
			}
			out[c.Code] = append(out[c.Code], compiledCondition{Condition: cd, prg: prg})
		}
	}
	return out, nil
}

// conditionCheck evaluates the command's declared conditions (CEL over the
// decoded request and the principal), in declaration order. A DENY that
// holds refuses the call at once (condition.denied, naming the
// condition); a REQUIRE_CONFIRMATION that holds makes confirmation_check
// ask a human, with the condition's description as the reason. A
// condition that cannot be evaluated refuses the call
// (condition.evaluation_failed): conditions fail closed. Conditions only
// tighten: none can waive a confirmation the declaration asks for. It
// only reads, so check mode runs it as it is.
func (e *Executor) conditionCheck(ctx context.Context, inv *invocation) (*Result, error) {
	conds := e.conditions[inv.cmd.Code]
	if len(conds) == 0 {
		return nil, nil
	}
	in := condition.Input{Request: inv.req, Principal: conditionPrincipal(inv)}
	for i := range conds {
		c := &conds[i]
		holds, err := c.prg.Eval(&in)
		if err != nil {
			fe := failure.New(StageCondition, failure.CodeConditionEvaluationFailed,
				"condition "+c.ID+" could not be evaluated on this call: "+evalError(err))
			fe.Remedy = "check the arguments condition " + c.ID + " reads; if they are right, ask an operator to fix the declaration"
			return nil, e.refuseWith(ctx, inv, fe)
		}
		if !holds {
			continue
		}
		switch c.Effect {
		case condition.EffectDeny:
			return nil, e.refuse(ctx, inv, StageCondition, failure.CodeConditionDenied,
				"condition "+c.ID+" denies this call: "+c.Description,
				"none as called: change the arguments, or have a human make the call if the condition allows it")
		case condition.EffectRequireConfirmation:
			inv.askedBy = append(inv.askedBy, c)
		}
	}
	return nil, nil
}

// evalError is CEL's evaluation error in one line, bounded: it names what
// failed (e.g. "no such key"), never an argument's value beyond what the
// expression's own text shows.
func evalError(err error) string {
	s := strings.Join(strings.Fields(err.Error()), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// conditionPrincipal is the `principal` a condition reads.
func conditionPrincipal(inv *invocation) *mandatev1.ConditionPrincipal {
	p := &mandatev1.ConditionPrincipal{
		Tenant: inv.p.Tenant, User: inv.p.UserID, Roles: inv.res.Roles, Agent: inv.p.AgentID,
		Model: inv.p.Model, Channel: inv.call.Channel,
	}
	switch inv.p.Kind {
	case identity.KindAgent:
		p.Kind = "agent"
	case identity.KindService:
		p.Kind = "service"
	case identity.KindUser:
		p.Kind = "user"
	}
	return p
}

// askedReason is why a human is asked, when conditions ask: each one's
// description and id; "" when the declaration asks by itself —
// and the limits the call would go past that escalate it.
func askedReason(inv *invocation) string {
	if len(inv.askedBy) == 0 && len(inv.escalatedBy) == 0 {
		return ""
	}
	parts := make([]string, 0, len(inv.askedBy)+1)
	for _, c := range inv.askedBy {
		parts = append(parts, c.Description+" (condition "+c.ID+")")
	}
	if len(inv.escalatedBy) > 0 {
		parts = append(parts, escalatedReason(inv))
	}
	return strings.Join(parts, "; ")
}

// askedIDs are the ids of the conditions that ask a human, then of the
// limits that escalate the call.
func askedIDs(inv *invocation) []string {
	if len(inv.askedBy) == 0 && len(inv.escalatedBy) == 0 {
		return nil
	}
	ids := make([]string, 0, len(inv.askedBy)+len(inv.escalatedBy))
	for _, c := range inv.askedBy {
		ids = append(ids, c.ID)
	}
	for _, l := range inv.escalatedBy {
		ids = append(ids, l.ID)
	}
	return ids
}
