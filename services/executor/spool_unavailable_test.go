package executor

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mandate-dev/mandate/internal/failure"
)

// TestSpoolKeepsRowsTheTrailCouldNotStore: a trail that is down, out of
// disk or failing inside (Internal) is no reason to drop a held audit row;
// only a row the trail refuses for what it is (a malformed row) is.
func TestSpoolKeepsRowsTheTrailCouldNotStore(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		keep bool
	}{
		{"unavailable", status.Error(codes.Unavailable, "connection refused"), true},
		{"internal (disk full, unclassified)", status.Error(codes.Internal, "no space left on device"), true},
		{"unknown", status.Error(codes.Unknown, "?"), true},
		{"deadline", context.DeadlineExceeded, true},
		{"store unavailable code", failure.New(failure.StageAudit, failure.CodeAuditUnavailable, "down"), true},
		{"a malformed row", status.Error(codes.InvalidArgument, "record: tenant is required"), false},
		{"a row refused by the chain", status.Error(codes.FailedPrecondition, "conflict"), false},
	} {
		if got := unavailable(c.err); got != c.keep {
			t.Errorf("%s: kept = %v, want %v", c.name, got, c.keep)
		}
	}
}
