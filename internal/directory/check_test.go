package directory_test

import (
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// checkCommands is a small manifest: an L4 erase approved by a holder of
// privacy.approve, a refund that needs the refunds feature, is approved by
// a holder of refund.approve and declares two limits, and a read.
var checkCommands = []*manifest.Command{
	{Code: "customer.erase", Permissions: []string{"customer.erase"}, Approver: manifest.Approver{Kind: "PERMISSION_HOLDER", Permission: "privacy.approve", Declared: true}},
	{Code: "ticket.refund", Permissions: []string{"payment.refund"}, RequiredFeature: "refunds", Approver: manifest.Approver{Kind: "PERMISSION_HOLDER", Permission: "refund.approve", Declared: true},
		Limits: []manifest.Limit{{ID: "agent-daily-refunds", Per: manifest.LimitPerAgent, Window: "86400s", Max: 5000}, {ID: "tenant-hourly", Per: manifest.LimitPerTenant, Window: "3600s", Max: 100}}},
	{Code: "ticket.get", Permissions: []string{"ticket.read"}, Approver: manifest.Approver{Kind: "REQUESTING_USER"}},
}

func TestCheckPolicy(t *testing.T) {
	cases := []struct {
		name string
		// tenant is the body of one tenant "acme" of a policy file.
		tenant string
		// want holds one "error: …" or "warning: …" line per finding, each
		// matched as substrings separated by " … ".
		want []string
	}{
		{"approver permission nobody holds", `
    roles: {finance: [customer.erase]}
    users: [{id: carol, roles: [finance]}]`,
			[]string{`error: … customer.erase … "privacy.approve" … no enabled user holds it … requests by carol`}},
		{"only the requester holds the approver permission", `
    roles: {finance: [customer.erase, privacy.approve]}
    users: [{id: carol, roles: [finance]}]`,
			[]string{`error: … customer.erase … only carol holds it … requests by carol`}},
		{"the only other holder is disabled", `
    roles: {finance: [customer.erase], ops: [privacy.approve]}
    users: [{id: carol, roles: [finance]}, {id: olive, roles: [ops], disabled: true}]`,
			[]string{`error: … customer.erase … no enabled user holds it`}},
		{"two holders approve each other", `
    roles: {finance: [customer.erase, privacy.approve]}
    users: [{id: carol, roles: [finance]}, {id: erin, roles: [finance]}]`,
			nil},
		{"another user approves", `
    roles: {finance: [customer.erase], ops: [privacy.approve]}
    users: [{id: carol, roles: [finance]}, {id: olive, roles: [ops]}]`,
			nil},
		{"nobody may request the command", `
    roles: {support: [ticket.read]}
    users: [{id: alice, roles: [support]}]`,
			nil},
		{"the tenant lacks the command's feature", `
    roles: {support: [payment.refund]}
    users: [{id: alice, roles: [support]}]`,
			nil},
		{"the tenant has the command's feature", `
    features: [refunds]
    roles: {support: [payment.refund]}
    users: [{id: alice, roles: [support]}]`,
			[]string{`error: … ticket.refund … "refund.approve"`}},
		{"a permission no command uses, near a known one", `
    roles: {support: [ticket.raed]}`,
			[]string{`warning: tenant "acme": role "support" grants "ticket.raed" … (did you mean "ticket.read"?)`}},
		{"a permission no command uses, near nothing", `
    roles: {support: [warehouse.forklift.drive]}`,
			[]string{`warning: … "warehouse.forklift.drive", which no command requires … service checks; fix`}},
		{"a platform permission", `
    roles: {auditor: [audit.read]}`,
			nil},
		{"an approver permission is known", `
    roles: {ops: [privacy.approve]}`,
			nil},
		{"a feature no command requires", `
    features: [refundz]`,
			[]string{`warning: tenant "acme": feature "refundz" is required by no command (did you mean "refunds"?)`}},
		{"limit overrides of declared limits", `
    limits:
      ticket.refund/agent-daily-refunds: {max: 10000, window: 12h}
      ticket.refund/tenant-hourly: {window: 2h}`,
			nil},
		{"a limit override of a command the manifest lacks", `
    limits: {tickt.refund/agent-daily-refunds: {max: 10}}`,
			[]string{`error: tenant "acme": limit override "tickt.refund/agent-daily-refunds" overrides nothing: no command tickt.refund is in the manifest (did you mean "ticket.refund/agent-daily-refunds"?)`}},
		{"a limit override of a limit the command does not declare", `
    limits: {ticket.refund/agent-daily-refund: {max: 10}}`,
			[]string{`error: tenant "acme": limit override "ticket.refund/agent-daily-refund" … ticket.refund declares no limit "agent-daily-refund" (it declares agent-daily-refunds, tenant-hourly) (did you mean "ticket.refund/agent-daily-refunds"?); fix the key`}},
		{"a limit override of a command that declares none", `
    limits: {customer.erase/weekly: {max: 1}}`,
			[]string{`error: … "customer.erase/weekly" … customer.erase declares no limits; fix`}},
		{"limit overrides are checked in key order, errors before warnings", `
    features: [payroll]
    limits: {zz.top/a: {max: 1}, ticket.refund/tenant-hourly: {max: 1}, aa.cmd/b: {max: 1}}`,
			[]string{`error: … "aa.cmd/b"`, `error: … "zz.top/a"`, `warning: … feature "payroll"`}},
		{"errors come before warnings", `
    features: [payroll]
    roles: {finance: [customer.erase]}
    users: [{id: carol, roles: [finance]}]`,
			[]string{`error: … customer.erase`, `warning: … feature "payroll"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pol, err := directory.ParsePolicy("p.yaml", []byte("tenants:\n  - id: acme"+tc.tenant+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			got := directory.CheckPolicy(pol, checkCommands, []string{"audit.read"})
			if len(got) != len(tc.want) {
				t.Fatalf("findings %q, want %d: %q", got, len(tc.want), tc.want)
			}
			for i, f := range got {
				if !matches(f.String(), tc.want[i]) {
					t.Errorf("finding %d = %q, want %q", i, f, tc.want[i])
				}
				if f.Warning != strings.HasPrefix(tc.want[i], "warning:") {
					t.Errorf("finding %q: Warning = %v", f, f.Warning)
				}
			}
		})
	}
}

// matches reports whether s holds the parts of pattern (separated by " … ")
// in order.
func matches(s, pattern string) bool {
	for _, part := range strings.Split(pattern, " … ") {
		i := strings.Index(s, part)
		if i < 0 {
			return false
		}
		s = s[i+len(part):]
	}
	return true
}
