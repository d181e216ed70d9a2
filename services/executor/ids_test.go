package executor

import (
	"regexp"
	"testing"
)

func TestNewInvocationID(t *testing.T) {
	shape := regexp.MustCompile(`^inv_[0-9a-f]{32}$`)
	a, b := NewInvocationID(), NewInvocationID()
	if !shape.MatchString(a) || !shape.MatchString(b) || a == b {
		t.Fatalf("ids %q and %q: want two different inv_ and 32 hex digits", a, b)
	}
}
