package executor

import (
	"testing"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mandate-dev/mandate/internal/callattr"
	"github.com/mandate-dev/mandate/internal/failure"
)

// TestRequestStateRefusal checks the refusal of an MCP retry whose
// requestState the bridge refused: a code of the confirmation's own is
// kept, anything else is confirmation.invalid_state, and only a code the
// table answers with Unavailable is retriable.
func TestRequestStateRefusal(t *testing.T) {
	for _, tt := range []struct {
		rule          string
		wantCode      string
		wantRetriable bool
	}{
		{failure.CodeConfirmationInvalidState, failure.CodeConfirmationInvalidState, false},
		{failure.CodeConfirmationExpired, failure.CodeConfirmationExpired, false},
		{failure.CodeConfirmationAlreadyDecided, failure.CodeConfirmationAlreadyDecided, false},
		{failure.CodeConfirmationUnavailable, failure.CodeConfirmationUnavailable, true},
		// Reported at confirmation_check, but not only there: not the
		// confirmation's own.
		{failure.CodeAuthorizationPermissionDenied, failure.CodeConfirmationInvalidState, false},
		{failure.CodeCommandNotFound, failure.CodeConfirmationInvalidState, false},
		{failure.CodeHandlerUnavailable, failure.CodeConfirmationInvalidState, false},
		{"confirmation.made_up", failure.CodeConfirmationInvalidState, false},
		{"", failure.CodeConfirmationInvalidState, false},
	} {
		t.Run(tt.rule, func(t *testing.T) {
			inv := &invocation{call: Call{Invalid: []callattr.Invalid{{Name: callattr.RequestState, Rule: tt.rule, Reason: "the bridge says no"}}}}
			fe := checkAttributes(inv)
			if fe == nil {
				t.Fatal("checkAttributes accepted a refused requestState")
			}
			if fe.Stage != StageConfirmation || fe.Code != tt.wantCode || fe.Retriable != tt.wantRetriable || fe.Message != "the bridge says no" {
				t.Errorf("got %s/%s retriable=%v %q, want %s/%s retriable=%v", fe.Stage, fe.Code, fe.Retriable, fe.Message,
					StageConfirmation, tt.wantCode, tt.wantRetriable)
			}
			if got, want := fe.GRPCStatus().Code(), failure.GRPCCode(tt.wantCode); got != want || got == codes.Internal {
				t.Errorf("gRPC code %v, want the table's %v", got, want)
			}
		})
	}
}

// TestInvalidAttributesStatus checks that a malformed attribute is refused
// with the table's gRPC code, InvalidArgument, at its stage.
func TestInvalidAttributesStatus(t *testing.T) {
	inv := &invocation{call: Call{ConversationID: "bad\x00conversation", IdempotencyKey: "bad\x00key"}}
	if fe := checkAttributes(inv); fe == nil || fe.Code != failure.CodeRequestInvalidMetadata || fe.Stage != StageRequest ||
		fe.GRPCStatus().Code() != codes.InvalidArgument {
		t.Errorf("conversation: got %v", fe)
	}
	if fe := checkIdempotencyKey(inv); fe == nil || fe.Code != failure.CodeIdempotencyInvalidKey || fe.Stage != StageIdempotency ||
		fe.GRPCStatus().Code() != codes.InvalidArgument {
		t.Errorf("idempotency key: got %v", fe)
	}
}

// TestResolvedExecutedStatus checks the replayed response of a key an
// operator resolved as executed: the table's FailedPrecondition, with its
// code and invocation.
func TestResolvedExecutedStatus(t *testing.T) {
	saved := ResolvedExecuted("inv-1", "alice", "checked the ledger")
	var st spb.Status
	if err := proto.Unmarshal(saved.Status, &st); err != nil {
		t.Fatal(err)
	}
	fe, ok := failure.FromStatus(grpcstatus.FromProto(&st))
	if !ok || fe.Status != codes.FailedPrecondition || fe.Code != failure.CodeIdempotencyResolvedExecuted || fe.InvocationID != "inv-1" {
		t.Errorf("got %+v", fe)
	}
}
