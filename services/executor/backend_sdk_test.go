package executor

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/manifestcheck"
	"github.com/mandate-dev/mandate/pkg/backend"
)

// TestBackendSDKRefusalsAsTheExecutorReadsThem: what pkg/backend's helpers produce, after the
// gRPC status round trip a backend's answer makes, is what backendFailure (the executor's one
// reading of a backend's error) turns into the refusal the agent sees.
func TestBackendSDKRefusalsAsTheExecutorReadsThem(t *testing.T) {
	withStatus := func(r *backend.Error, c codes.Code) *backend.Error { r.Status = c; return r }
	violation := backend.Refuse(backend.StageSchemaValidate, backend.CodeSchemaInvalid, "amount must be positive")
	violation.Violations = []backend.Violation{{Pointer: "/amount", Rule: "helpdesk", Message: "amount must be positive"}}
	retriable := backend.Refuse(backend.StageDispatch, "payment.gateway_unavailable", "the gateway failed; nothing was refunded")
	retriable.Status, retriable.Retriable, retriable.Remedy = codes.Unavailable, true, "retry later"
	tests := []struct {
		name       string
		err        error
		wantStage  string
		wantCode   string
		wantStatus codes.Code
	}{
		{"a domain refusal at state_check", backend.Refuse(backend.StageStateCheck, "state.ticket_closed", "ticket T-1 is closed"),
			backend.StageStateCheck, "state.ticket_closed", codes.FailedPrecondition},
		{"a domain refusal with its own gRPC code", withStatus(backend.Refuse(backend.StageStateCheck, "state.not_found", "no T-9"), codes.NotFound),
			backend.StageStateCheck, "state.not_found", codes.NotFound},
		{"pre_invariant", backend.Refuse(backend.StagePreInvariant, "refund.exceeds_paid", "more than was paid"),
			backend.StagePreInvariant, "refund.exceeds_paid", codes.FailedPrecondition},
		{"assert", backend.Refuse(backend.StageAssert, "assert.balance", "the balance would go negative"),
			backend.StageAssert, "assert.balance", codes.FailedPrecondition},
		{"post_invariant", backend.Refuse(backend.StagePostInvariant, "invariant.totals", "totals differ"),
			backend.StagePostInvariant, "invariant.totals", codes.FailedPrecondition},
		{"one of Mandate's codes takes the table's gRPC code", backend.Refuse(backend.StageScopeCheck, backend.CodeScopeDenied, "not yours"),
			backend.StageScopeCheck, backend.CodeScopeDenied, codes.PermissionDenied},
		{"schema violations", violation, backend.StageSchemaValidate, backend.CodeSchemaInvalid, codes.InvalidArgument},
		{"a client-error refusal at another stage is reported at dispatch", backend.Refuse("lookup", "state.gone", "gone"),
			StageDispatch, "state.gone", codes.FailedPrecondition},
		{"a retriable fault is the executor's handler.unavailable", retriable, StageDispatch, failure.CodeHandlerUnavailable, codes.OK},
		{"an internal fault is handler.failed", backend.Internal(errors.New("pq: connection refused")), StageDispatch, failure.CodeHandlerFailed, codes.OK},
		{"StatusOf a plain error is handler.failed", backend.StatusOf(errors.New("boom")).Err(), StageDispatch, failure.CodeHandlerFailed, codes.OK},
		{"StatusOf a deadline is handler.deadline_exceeded", backend.StatusOf(fmt.Errorf("store: %w", context.DeadlineExceeded)).Err(),
			StageDispatch, failure.CodeHandlerDeadlineExceeded, codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// What the backend's gRPC server sends is what the executor's client receives:
			// the status, marshalled and back.
			wire := status.FromProto(status.Convert(tc.err).Proto()).Err()
			fe := backendFailure(wire)
			if fe.Stage != tc.wantStage || fe.Code != tc.wantCode || fe.Status != tc.wantStatus {
				t.Fatalf("backendFailure = %s/%s %v (%s), want %s/%s %v", fe.Stage, fe.Code, fe.Status, fe.Message, tc.wantStage, tc.wantCode, tc.wantStatus)
			}
			if r, ok := backend.AsError(tc.err); ok && tc.wantStatus != codes.OK {
				if fe.Message != r.Message || len(fe.Violations) != len(r.Violations) {
					t.Errorf("the executor reads %q with %d violations, the backend sent %q with %d", fe.Message, len(fe.Violations), r.Message, len(r.Violations))
				}
			}
		})
	}
}

// TestBackendSDKNamesWhatTheExecutorSends: pkg/backend's names of the executor's metadata and
// service identity are the executor's.
func TestBackendSDKNamesWhatTheExecutorSends(t *testing.T) {
	for _, c := range []struct{ sdk, executor string }{
		{backend.InvocationIDHeader, MetadataInvocationID},
		{backend.IdempotencyKeyHeader, MetadataIdempotencyKey},
		{backend.ManifestDigestHeader, manifestcheck.Header},
		{backend.DefaultRelay, ServiceName},
	} {
		if c.sdk != c.executor {
			t.Errorf("pkg/backend says %q, the executor %q", c.sdk, c.executor)
		}
	}
}
