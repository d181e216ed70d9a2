// Package condition compiles and evaluates a command's declared conditions
// (mandate.v1.Condition): CEL expressions over the typed request message
// (`request`) and the caller (`principal`, a mandate.v1.ConditionPrincipal).
// The build (internal/compile) type-checks them with Compile; the executor
// compiles them once per command when its manifest loads and evaluates the
// programs on every call (stage condition_check).
package condition

import (
	"errors"
	"fmt"
	"regexp"

	"cel.dev/cel-go/cel"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// Effects, as the manifest spells them.
const (
	EffectRequireConfirmation = "REQUIRE_CONFIRMATION"
	EffectDeny                = "DENY"
)

// Variables an expression reads.
const (
	VarRequest   = "request"
	VarPrincipal = "principal"
)

// MaxExpressionBytes bounds one expression's source.
const MaxExpressionBytes = 4096

// IDPattern is a condition id: lower-case segments of letters and digits
// joined by '-', '_' or '.', at most 64 characters.
var IDPattern = regexp.MustCompile(`^[a-z][a-z0-9]*([-_.][a-z0-9]+)*$`)

// MaxIDLen bounds an id.
const MaxIDLen = 64

// EffectName is the manifest's name of e, "" for an unspecified or unknown
// effect.
func EffectName(e mandatev1.ConditionEffect) string {
	switch e {
	case mandatev1.ConditionEffect_CONDITION_EFFECT_REQUIRE_CONFIRMATION:
		return EffectRequireConfirmation
	case mandatev1.ConditionEffect_CONDITION_EFFECT_DENY:
		return EffectDeny
	}
	return ""
}

// Env is the CEL environment of one request message: `request` typed as
// that message, `principal` as a mandate.v1.ConditionPrincipal.
type Env struct {
	env *cel.Env
}

// NewEnv returns the environment of conditions over input, whose types
// (and their imports) files holds.
func NewEnv(files *protoregistry.Files, input protoreflect.MessageDescriptor) (*Env, error) {
	env, err := cel.NewEnv(
		cel.TypeDescs(files),
		cel.Types(&mandatev1.ConditionPrincipal{}),
		cel.Variable(VarRequest, cel.ObjectType(string(input.FullName()))),
		cel.Variable(VarPrincipal, cel.ObjectType(string((&mandatev1.ConditionPrincipal{}).ProtoReflect().Descriptor().FullName()))),
	)
	if err != nil {
		return nil, fmt.Errorf("condition: environment of %s: %w", input.FullName(), err)
	}
	return &Env{env: env}, nil
}

// Program is one compiled condition's expression.
type Program struct {
	prg cel.Program
}

// Compile parses and type-checks expr; an expression that does not compile
// or is not a boolean is an error that says why, in CEL's words.
func (e *Env) Compile(expr string) (*Program, error) {
	if len(expr) > MaxExpressionBytes {
		return nil, fmt.Errorf("the expression is longer than %d bytes", MaxExpressionBytes)
	}
	ast, iss := e.env.Compile(expr)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	if !ast.OutputType().IsExactType(cel.BoolType) {
		return nil, fmt.Errorf("the expression is a %s, not a bool", ast.OutputType())
	}
	// No runtime cost limit: it tracks the cost of every evaluation
	// (about 2.5x the stage's time in BenchmarkConditionStage), while the
	// expression is the declaration author's, type-checked at build time,
	// and what it can iterate over is bounded by the decoder's limits.
	prg, err := e.env.Program(ast, cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, err
	}
	return &Program{prg: prg}, nil
}

// Input is what an expression reads.
type Input struct {
	Request   proto.Message
	Principal *mandatev1.ConditionPrincipal
}

// activation hands Input's two variables to CEL without building a map.
type activation struct{ in *Input }

func (a activation) ResolveName(name string) (any, bool) {
	switch name {
	case VarRequest:
		return a.in.Request, true
	case VarPrincipal:
		return a.in.Principal, true
	}
	return nil, false
}

func (a activation) Parent() cel.Activation { return nil }

// ErrNotBool is an evaluation whose result is no boolean (a dynamic value
// the checker could not type).
var ErrNotBool = errors.New("condition: the expression did not evaluate to a bool")

// Eval reports whether the expression holds for in. An error (a field the
// expression reads that breaks it, the cost limit) means the condition
// could not decide: the caller fails closed.
func (p *Program) Eval(in *Input) (bool, error) {
	out, _, err := p.prg.Eval(cel.Activation(activation{in}))
	if err != nil {
		return false, err
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, ErrNotBool
	}
	return b, nil
}
