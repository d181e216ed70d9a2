package failure_test

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/internal/failure"
)

func TestFromStatus(t *testing.T) {
	full := failure.New("confirmation_check", "confirmation.required", "a human must approve")
	full.Remedy, full.Retriable = "ask your user", true
	full.InvocationID, full.ChallengeID, full.ApprovalURL = "inv_1", "ch_1", "https://approve.test/approve/ch_1"
	full.Violations = []failure.Violation{{Pointer: "/amount", Rule: "minimum", Message: "too small"}}
	overridden := failure.New("dispatch", "handler.failed", "backend said no")
	overridden.Status = codes.Aborted
	infoOnly, err := status.New(codes.PermissionDenied, "denied").WithDetails(&errdetails.ErrorInfo{
		Reason: "authorization.permission_denied", Domain: failure.Domain, Metadata: map[string]string{"stage": "permission_check"},
	})
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := status.New(codes.PermissionDenied, "x").WithDetails(&errdetails.ErrorInfo{Reason: "NOPE", Domain: "example.com"})
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name   string
		st     *status.Status
		ok     bool
		want   failure.Error
		grpcIs codes.Code
	}{
		{name: "command error round trip", st: full.GRPCStatus(), ok: true, want: *full, grpcIs: codes.FailedPrecondition},
		{name: "status override kept", st: overridden.GRPCStatus(), ok: true, want: *overridden, grpcIs: codes.Aborted},
		{name: "error info only", st: infoOnly, ok: true,
			want: failure.Error{Stage: "permission_check", Code: "authorization.permission_denied", Message: "denied"}, grpcIs: codes.PermissionDenied},
		{name: "foreign domain", st: foreign},
		{name: "plain status", st: status.New(codes.Unavailable, "connection refused")},
		{name: "context", st: status.FromContextError(context.Canceled)},
		{name: "ok", st: status.New(codes.OK, "")},
		{name: "nil", st: nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := failure.FromStatus(tc.st)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v (%v)", ok, tc.ok, got)
			}
			if !ok {
				return
			}
			if got.Stage != tc.want.Stage || got.Code != tc.want.Code || got.Message != tc.want.Message ||
				got.Retriable != tc.want.Retriable || got.Remedy != tc.want.Remedy || got.InvocationID != tc.want.InvocationID ||
				got.ChallengeID != tc.want.ChallengeID || got.ApprovalURL != tc.want.ApprovalURL || len(got.Violations) != len(tc.want.Violations) {
				t.Fatalf("got %+v\nwant %+v", *got, tc.want)
			}
			for i := range got.Violations {
				if got.Violations[i] != tc.want.Violations[i] {
					t.Fatalf("violation %d: %+v, want %+v", i, got.Violations[i], tc.want.Violations[i])
				}
			}
			if c := status.Convert(got).Code(); c != tc.grpcIs {
				t.Fatalf("re-encoded as %v, want %v", c, tc.grpcIs)
			}
			if !errors.Is(got, failure.New("", tc.want.Code, "")) {
				t.Fatal("errors.Is by code fails")
			}
		})
	}
}
