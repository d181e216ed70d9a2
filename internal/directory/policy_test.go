package directory_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/directory/directorytest"
)

func TestParsePolicy(t *testing.T) {
	src := `
version: 1
tenants:
  - id: acme
    display_name: Acme
    features: [refunds, expenses]
    roles:
      support: &perms [ticket.read, expense.report.submit]
      backup: *perms
    users:
      - id: alice
        org: support
        roles: [support, backup]
      - {id: 1234, disabled: true}
    agents:
      - {id: support-bot, user: alice}
`
	pol, err := directory.ParsePolicy("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := directory.Policy{Tenants: []directory.Snapshot{{
		Tenant: directory.Tenant{ID: "acme", DisplayName: "Acme", Features: []string{"expenses", "refunds"}},
		Roles: []directory.Role{
			{Tenant: "acme", Name: "backup", Permissions: []string{"expense.report.submit", "ticket.read"}},
			{Tenant: "acme", Name: "support", Permissions: []string{"expense.report.submit", "ticket.read"}},
		},
		Users: []directory.User{
			{Tenant: "acme", ID: "1234", Disabled: true},
			{Tenant: "acme", ID: "alice", Org: "support", Roles: []string{"backup", "support"}},
		},
		Agents: []directory.Agent{{Tenant: "acme", ID: "support-bot", UserID: "alice", Host: directory.HostHeadless}},
	}}}
	if !reflect.DeepEqual(pol, want) {
		t.Fatalf("got  %+v\nwant %+v", pol, want)
	}
}

func TestParsePolicyErrors(t *testing.T) {
	for _, tc := range directorytest.MalformedCases {
		t.Run(tc.Name, func(t *testing.T) {
			_, err := directory.ParsePolicy("x.yaml", []byte(tc.YAML))
			var perr *directory.PolicyError
			if !errors.As(err, &perr) || perr.Line != tc.Line || !strings.Contains(perr.Msg, tc.Msg) {
				t.Fatalf("err = %v, want line %d and %q", err, tc.Line, tc.Msg)
			}
		})
	}
}

func TestSummaryString(t *testing.T) {
	s := directory.Summary{Users: directory.Counts{Created: 1, Removed: 2}}
	if got := s.String(); got != "tenants +0 ~0 -0, roles +0 ~0 -0, users +1 ~0 -2, agents +0 ~0 -0" {
		t.Fatalf("String() = %q", got)
	}
	if s.Changes() != 3 {
		t.Fatalf("Changes() = %d", s.Changes())
	}
}
