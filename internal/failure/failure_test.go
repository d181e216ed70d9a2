package failure_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
)

func TestCodeMapping(t *testing.T) {
	cases := []struct {
		code  string
		grpc  codes.Code
		httpS int
	}{
		{"authentication.invalid_token", codes.Unauthenticated, http.StatusUnauthorized},
		{"command.not_found", codes.NotFound, http.StatusNotFound},
		{"entitlement.missing", codes.PermissionDenied, http.StatusForbidden},
		{"authorization.permission_denied", codes.PermissionDenied, http.StatusForbidden},
		{"scope.tenant_mismatch", codes.PermissionDenied, http.StatusForbidden},
		{"sod.conflict", codes.PermissionDenied, http.StatusForbidden},
		{"schema.invalid", codes.InvalidArgument, http.StatusBadRequest},
		{"idempotency.in_flight", codes.Aborted, http.StatusConflict},
		{"idempotency.key_reused", codes.FailedPrecondition, http.StatusUnprocessableEntity},
		{"confirmation.required", codes.FailedPrecondition, http.StatusUnprocessableEntity},
		{"confirmation.approver_not_allowed", codes.PermissionDenied, http.StatusForbidden},
		{"audit.unavailable", codes.Unavailable, http.StatusServiceUnavailable},
		{"handler.deadline_exceeded", codes.DeadlineExceeded, http.StatusGatewayTimeout},
		{"handler.failed", codes.Internal, http.StatusInternalServerError},
	}
	for _, tc := range cases {
		t.Run(tc.code, func(t *testing.T) {
			e := failure.New("stage_x", tc.code, "m")
			st := status.Convert(e)
			if st.Code() != tc.grpc {
				t.Fatalf("gRPC %v, want %v", st.Code(), tc.grpc)
			}
			p := failure.Problem(st, "/v1/x")
			if p.Status != tc.httpS || p.Code != tc.code || p.Stage != "stage_x" {
				t.Fatalf("problem %+v, want status %d code %s", p, tc.httpS, tc.code)
			}
		})
	}
}

func TestStatusCarriesErrorInfoAndCommandError(t *testing.T) {
	e := &failure.Error{
		Stage: "schema_validate", Code: "schema.invalid", Message: "bad input", Remedy: "fix the arguments",
		InvocationID: "inv-1", Violations: []failure.Violation{{Pointer: "/amount/amount_minor", Rule: "int64.gt", Message: "must be > 0"}},
	}
	wrapped := fmt.Errorf("while executing: %w", e)
	st := failure.ToStatus(wrapped)
	var info *errdetails.ErrorInfo
	var ce *mandatev1.CommandError
	for _, d := range st.Details() {
		switch x := d.(type) {
		case *errdetails.ErrorInfo:
			info = x
		case *mandatev1.CommandError:
			ce = x
		}
	}
	if info.GetReason() != "schema.invalid" || info.GetDomain() != failure.Domain || info.GetMetadata()["stage"] != "schema_validate" {
		t.Fatalf("ErrorInfo %v", info)
	}
	if ce.GetCode() != "schema.invalid" || ce.GetInvocationId() != "inv-1" || len(ce.GetViolations()) != 1 || ce.GetViolations()[0].GetPointer() != "/amount/amount_minor" {
		t.Fatalf("CommandError %v", ce)
	}
	p := failure.Problem(st, "/v1/commands/ticket.refund:execute")
	if len(p.Errors) != 1 || p.Errors[0].Rule != "int64.gt" || p.Remedy != "fix the arguments" || p.InvocationID != "inv-1" {
		t.Fatalf("problem %+v", p)
	}
	if !errors.Is(wrapped, failure.New("", "schema.invalid", "")) {
		t.Fatal("errors.Is does not match by code")
	}
}

func TestInternalErrorsDoNotLeak(t *testing.T) {
	raw := errors.New(`pq: relation "audit.records" does not exist at /srv/mandate/internal/x.go:12`)
	for _, err := range []error{raw, failure.Internal("dispatch", raw)} {
		st := failure.ToStatus(err)
		if st.Code() != codes.Internal || strings.Contains(st.Message(), "relation") || strings.Contains(st.Message(), ".go") {
			t.Fatalf("status leaks internals: %v", st)
		}
		if p := failure.Problem(st, "/"); p.Code != "internal.error" || p.Status != http.StatusInternalServerError {
			t.Fatalf("problem %+v", p)
		}
	}
	if st := failure.ToStatus(context.Canceled); st.Code() != codes.Canceled {
		t.Fatalf("canceled: %v", st)
	}
	if st := failure.ToStatus(fmt.Errorf("x: %w", context.DeadlineExceeded)); st.Code() != codes.DeadlineExceeded {
		t.Fatalf("deadline: %v", st)
	}
}

// TestProblemOfABareUnavailable: a status Unavailable without a Mandate
// detail — a draining or restarting service, as the transport reports it —
// is a retriable service.unavailable with a plain message, not
// grpc.unavailable with transport text.
func TestProblemOfABareUnavailable(t *testing.T) {
	p := failure.Problem(status.New(codes.Unavailable, "transport is closing"), "/v1/x")
	if p.Code != failure.CodeServiceUnavailable || !p.Retriable || p.Status != http.StatusServiceUnavailable || strings.Contains(p.Detail, "transport") || p.Remedy == "" {
		t.Fatalf("problem %+v", p)
	}
	// A Mandate refusal that is Unavailable keeps its own code.
	q := failure.Problem(failure.ToStatus(failure.New("dispatch", "handler.unavailable", "the backend is unavailable")), "")
	if q.Code != "handler.unavailable" {
		t.Fatalf("problem %+v", q)
	}
}
