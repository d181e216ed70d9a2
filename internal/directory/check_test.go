package directory_test

import (
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// checkCommands is a small manifest: an L4 erase approved by a holder of
// privacy.approve, a refund that needs the refunds feature and is approved
// by a holder of refund.approve, and a read.
var checkCommands = []*manifest.Command{
	{Code: "customer.erase", Permissions: []string{"customer.erase"}, Approver: manifest.Approver{Kind: "PERMISSION_HOLDER", Permission: "privacy.approve", Declared: true}},
	{Code: "ticket.refund", Permissions: []string{"payment.refund"}, RequiredFeature: "refunds", Approver: manifest.Approver{Kind: "PERMISSION_HOLDER", Permission: "refund.approve", Declared: true}},
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
