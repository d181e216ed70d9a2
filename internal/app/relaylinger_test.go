package app

import (
	"strings"
	"testing"
)

// TestAuditRelayLingerIsBounded: the executor refuses a linger below 0 or
// above a second (a row must reach the trail within a second of its call),
// naming the flag and the range, before it starts anything.
func TestAuditRelayLingerIsBounded(t *testing.T) {
	env := map[string]string{"MANDATE_DEV_SECRET": testSecret, "MANDATE_SERVICE_SECRET": testSecret, "MANDATE_STORE": "memory"}
	for _, v := range []string{"-1ms", "1.5s"} {
		code, _, errOut := run(t, env, "executor", "--manifest=sample", "--backend", "examples.helpdesk.v1.HelpdeskService=127.0.0.1:1", "--audit-relay-linger", v)
		if code != 1 || !strings.Contains(errOut, "audit-relay-linger") || !strings.Contains(errOut, "from 0 to 1s") {
			t.Errorf("--audit-relay-linger %s: exit %d, stderr %q; want 1 and the range", v, code, errOut)
		}
	}
}
