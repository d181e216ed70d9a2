package executor

import (
	"context"
	"errors"

	"google.golang.org/protobuf/proto"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/schema"
)

// schemaValidate decodes the arguments with the descriptor set (unknown
// fields refused) and validates them, then derives what later stages and
// the audit rows carry: the canonical bytes and their digest, the redacted
// arguments, the subject.
//
// A call that carries a grant resumes instead where its call was parked
// when the challenge was opened (resume): the arguments are restored from
// the parked canonical bytes, neither decoded nor validated again.
func (e *Executor) schemaValidate(ctx context.Context, inv *invocation) (*Result, error) {
	if inv.call.GrantID != "" && inv.call.InputError == nil && e.resume(ctx, inv) {
		return nil, nil
	}
	var (
		err  error
		args schema.Arguments
	)
	if inv.call.InputError != nil {
		err = inv.call.InputError
	} else {
		// The input is read as JSON once: the arguments it decodes to are
		// what is redacted below.
		inv.req, args, err = e.decoder.DecodeArguments(inv.method.Input(), inv.call.Input)
	}
	if err != nil {
		var bad *schema.InvalidError
		if errors.As(err, &bad) {
			fe := failure.New(StageSchema, failure.CodeSchemaInvalid, "the arguments break the command's schema")
			fe.Remedy = "fix the arguments listed in violations"
			for _, v := range bad.Violations {
				fe.Violations = append(fe.Violations, failure.Violation{Pointer: v.Pointer, Rule: v.Rule, Message: v.Message})
			}
			return nil, e.refuseWith(ctx, inv, fe)
		}
		return nil, e.fault(ctx, inv, StageSchema, failure.CodeInternalError, err)
	}
	msg := inv.req
	// The bytes are the same with AllowPartial; it only skips a check that
	// cannot fail (schema.CanLackRequired).
	inv.canon, err = proto.MarshalOptions{Deterministic: true, AllowPartial: !schema.CanLackRequired(msg.Descriptor())}.Marshal(msg)
	if err != nil {
		return nil, e.fault(ctx, inv, StageSchema, failure.CodeInternalError, err)
	}
	inv.argDigest = digest(inv.cmd.Code, inv.canon)
	redacted, withheld := args.Redact(e.sensitiveInput(inv.cmd))
	inv.args, inv.withheld = string(redacted), withheld
	inv.subject = subjectOf(msg, inv.cmd.SubjectField)
	return nil, nil
}
