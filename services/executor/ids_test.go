package executor

import (
	"regexp"
	"strings"
	"testing"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

func TestNewInvocationID(t *testing.T) {
	shape := regexp.MustCompile(`^inv_[0-9a-f]{32}$`)
	a, b := NewInvocationID(), NewInvocationID()
	if !shape.MatchString(a) || !shape.MatchString(b) || a == b {
		t.Fatalf("ids %q and %q: want two different inv_ and 32 hex digits", a, b)
	}
}

func TestAuditID(t *testing.T) {
	long := strings.Repeat("t", 200) // past the stack buffer
	for _, tc := range []struct {
		name   string
		stored []*mandatev1.AuditRecord
		want   string
	}{
		{"none", nil, ""},
		{"first row", []*mandatev1.AuditRecord{{Tenant: "acme", Seq: 42}, {Tenant: "acme", Seq: 43}}, "acme/42"},
		{"long tenant", []*mandatev1.AuditRecord{{Tenant: long, Seq: 9007199254740993}}, long + "/9007199254740993"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := auditID(tc.stored); got != tc.want {
				t.Errorf("auditID = %q, want %q", got, tc.want)
			}
		})
	}
}
