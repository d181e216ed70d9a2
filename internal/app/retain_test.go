package app

import (
	"strings"
	"testing"
)

func TestAuditRetainRefusesNegative(t *testing.T) {
	env := map[string]string{"MANDATE_DEV_SECRET": testSecret, "MANDATE_SERVICE_SECRET": testSecret}
	for _, args := range [][]string{
		{"dev", "--audit-retain", "-1"},
		{"audit", "--store", "memory", "--audit-retain", "-1"},
	} {
		t.Run(args[0], func(t *testing.T) {
			code, _, errOut := run(t, env, args...)
			if code == 0 || !strings.Contains(errOut, "--audit-retain (MANDATE_AUDIT_RETAIN) must be 0 (keep every row) or more") {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
		})
	}
}
