package app

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/executor"
)

// TestTheAuditTrailWaitsForTheReceiptsFirst (issue 31 item 1): by default,
// the audit service records an intent without outcome as unknown only
// after the executors' receipt reconciler had its chance — the intent's
// age past which the executor settles it, plus one of its rounds — so
// that no intent an executor can still settle from its backend's receipt
// is recorded unknown first. The flags of both services default to these
// constants.
func TestTheAuditTrailWaitsForTheReceiptsFirst(t *testing.T) {
	executorLast := executor.DefaultReconcileAfter + executor.DefaultReconcileInterval
	if audit.DefaultReconcileAfter <= executorLast {
		t.Fatalf("the audit reconciler records unknown after %v; the executor settles from receipts until %v", audit.DefaultReconcileAfter, executorLast)
	}
	for _, c := range []struct {
		cmd, flag, want string
	}{
		{"audit", "reconcile-after", audit.DefaultReconcileAfter.String()},
		{"audit", "reconcile-interval", audit.DefaultReconcileInterval.String()},
		{"executor", "reconcile-after", executor.DefaultReconcileAfter.String()},
		{"executor", "reconcile-interval", executor.DefaultReconcileInterval.String()},
	} {
		if got := flagDefault(t, c.cmd, c.flag); got != c.want {
			t.Errorf("mandate %s --%s defaults to %s, want %s", c.cmd, c.flag, got, c.want)
		}
	}
}

// flagDefault is the default `mandate cmd -h` prints for --flag.
func flagDefault(t *testing.T, cmd, flag string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	Run(context.Background(), []string{cmd, "-h"}, IO{Stdout: &out, Stderr: &errOut, Env: func(string) (string, bool) { return "", false }})
	lines := strings.Split(out.String()+errOut.String(), "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "-"+flag+" ") && i+1 < len(lines) {
			usage := lines[i+1]
			if j := strings.LastIndex(usage, "(default "); j >= 0 {
				return strings.TrimSuffix(usage[j+len("(default "):], ")")
			}
		}
	}
	t.Fatalf("mandate %s -h shows no default for --%s", cmd, flag)
	return ""
}
