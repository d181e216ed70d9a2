package executor

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// maxDeadLetters bounds one listing and one re-drive by ids.
const maxDeadLetters = 1000

// DeadLetters lists up to limit (0: 100) of the rows of p's tenant the
// trail refused outright, oldest first. Only an operator may (mayResolve:
// a user acting directly, holding audit.resolve and audit.read).
func (e *Executor) DeadLetters(ctx context.Context, p identity.Principal, limit int) ([]*mandatev1.DeadLetter, error) {
	if err := e.mayResolve(ctx, p); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	rows, err := e.cfg.Store.DeadLetters(ctx, p.Tenant, min(limit, maxDeadLetters))
	if err != nil {
		return nil, failure.New(StageAudit, failure.CodeAuditUnavailable, "the dead letter, in the executor's store, could not be read or changed; try again")
	}
	out := make([]*mandatev1.DeadLetter, 0, len(rows))
	for _, r := range rows {
		d := &mandatev1.DeadLetter{Id: r.ID, InvocationId: r.InvocationID, SpooledAt: timestamppb.New(r.Spooled),
			DeadAt: timestamppb.New(r.Dead), Reason: r.Reason}
		if rec, err := decodeSpooled(r.Record); err == nil {
			d.Record = rec
		}
		out = append(out, d)
	}
	return out, nil
}

// Redrive moves rows of p's tenant from the dead letter back to the spool
// (ids; all, every one), whose flusher appends them to the trail; only an
// operator may, giving a reason, and the log names them.
func (e *Executor) Redrive(ctx context.Context, p identity.Principal, ids []int64, all bool, reason string) (int, error) {
	if err := e.mayResolve(ctx, p); err != nil {
		return 0, err
	}
	if err := CheckReason(reason); err != nil {
		return 0, err
	}
	switch {
	case all && len(ids) > 0:
		return 0, failure.New(failure.StageSchema, failure.CodeSchemaInvalid, "name the rows to re-drive or ask for all of them, not both")
	case !all && len(ids) == 0:
		return 0, failure.New(failure.StageSchema, failure.CodeSchemaInvalid, "name the rows to re-drive (their ids) or ask for all of them")
	case len(ids) > maxDeadLetters:
		return 0, failure.New(failure.StageSchema, failure.CodeSchemaInvalid, "at most 1000 rows at once")
	}
	if all {
		ids = nil
	}
	n, err := e.cfg.Store.Redrive(ctx, p.Tenant, ids)
	if err != nil {
		return 0, failure.New(StageAudit, failure.CodeAuditUnavailable, "the dead letter, in the executor's store, could not be read or changed; try again")
	}
	e.log.Warn("audit spool: dead-lettered rows re-driven by an operator", "tenant", p.Tenant, "user", p.UserID,
		"rows", n, "reason", reason)
	return n, nil
}
