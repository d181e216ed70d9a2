package failure

import (
	"strings"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// Stage names: each is the wire name of a mandate.v1.Stage value (the
// value's name without STAGE_, in lower case), the one list of stages.
// TestStagesAreTheEnum keeps the two equal; every other package spells a
// stage with these constants (TestStageNamesComeFromTheEnum).
const (
	StageDecode        = "decode"
	StageAuthenticate  = "authenticate"
	StageRequest       = "request_check"
	StageLoad          = "load_definition"
	StageEntitlement   = "entitlement_check"
	StagePermission    = "permission_check"
	StageSchema        = "schema_validate"
	StageScope         = "scope_check"
	StageIdempotency   = "idempotency_check"
	StageSoD           = "sod_check"
	StageConfirmation  = "confirmation_check"
	StageAudit         = "audit"
	StageDispatch      = "dispatch"
	StageState         = "state_check"
	StagePreInvariant  = "pre_invariant"
	StageAssert        = "assert"
	StagePostInvariant = "post_invariant"
	StageAuditOutcome  = "audit_outcome"
	StagePublish       = "publish"
	StageCondition     = "condition_check"
	StageBudget        = "budget_check"
)

// StageName returns the wire name of s, "" for STAGE_UNSPECIFIED or a value
// this build does not know.
func StageName(s mandatev1.Stage) string {
	if s == mandatev1.Stage_STAGE_UNSPECIFIED {
		return ""
	}
	n, ok := mandatev1.Stage_name[int32(s)]
	if !ok {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(n, "STAGE_"))
}

// StageOf returns the Stage whose wire name is name, and false for a name
// that is no stage.
func StageOf(name string) (mandatev1.Stage, bool) {
	if name == "" {
		return mandatev1.Stage_STAGE_UNSPECIFIED, false
	}
	v, ok := mandatev1.Stage_value["STAGE_"+strings.ToUpper(name)]
	return mandatev1.Stage(v), ok && v != 0
}

// Stages returns every stage's wire name, in the enum's order.
func Stages() []string {
	out := make([]string, 0, len(mandatev1.Stage_name)-1)
	for i := int32(1); i < int32(len(mandatev1.Stage_name)); i++ {
		if n := StageName(mandatev1.Stage(i)); n != "" {
			out = append(out, n)
		}
	}
	return out
}
