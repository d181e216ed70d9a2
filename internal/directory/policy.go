package directory

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mandate-dev/mandate/internal/limit"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// DefaultPolicyFile is the file name used in error messages when none is given.
const DefaultPolicyFile = "policy.yaml"

// Policy is a parsed and validated policy file: the complete desired state of each tenant it
// names.
type Policy struct {
	// Tenants in file order; each Snapshot is normalised (sorted, unique).
	Tenants []Snapshot
}

// PolicyError is a problem in a policy file, located by line.
type PolicyError struct {
	// File is the name the file was given.
	File string
	// Line is the 1-based line, or 0 when the problem has no single location.
	Line int
	// Msg describes the problem.
	Msg string
}

// Error formats the error as "file:line: msg".
func (e *PolicyError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// yamlLineRE extracts the location from go.yaml.in/yaml/v3 syntax errors, which are plain
// formatted strings ("yaml: line 3: could not find expected ':'").
var yamlLineRE = regexp.MustCompile(`^yaml: line ([0-9]+): (.*)$`)

// ParsePolicy parses and validates a policy file; see the package documentation for the
// format. name is used in error messages. Every error is a *PolicyError.
func ParsePolicy(name string, src []byte) (Policy, error) {
	p := &policyParser{file: name}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return Policy{}, &PolicyError{File: name, Msg: "empty policy file"}
		}
		return Policy{}, p.syntaxErr(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return Policy{}, p.errf(&extra, "more than one YAML document")
	} else if !errors.Is(err, io.EOF) {
		return Policy{}, p.syntaxErr(err)
	}
	return p.policy(&doc)
}

type policyParser struct{ file string }

func (p *policyParser) errf(n *yaml.Node, format string, args ...any) error {
	return &PolicyError{File: p.file, Line: n.Line, Msg: fmt.Sprintf(format, args...)}
}

func (p *policyParser) syntaxErr(err error) error {
	if m := yamlLineRE.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &PolicyError{File: p.file, Line: line, Msg: "syntax error: " + m[2]}
	}
	return &PolicyError{File: p.file, Msg: "syntax error: " + err.Error()}
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// fields walks a mapping node, rejecting unknown and repeated keys, and calls fn for each pair.
func (p *policyParser) fields(n *yaml.Node, what string, allowed []string, fn func(key string, k, v *yaml.Node) error) error {
	n = resolveAlias(n)
	if n.Kind != yaml.MappingNode {
		return p.errf(n, "%s must be a mapping", what)
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], resolveAlias(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			return p.errf(k, "%s keys must be plain names", what)
		}
		key := k.Value
		known := false
		for _, a := range allowed {
			known = known || a == key
		}
		if !known {
			return p.errf(k, "unknown field %q", key)
		}
		if first, dup := seen[key]; dup {
			return p.errf(k, "field %q repeated (first at line %d)", key, first)
		}
		seen[key] = k.Line
		if err := fn(key, k, v); err != nil {
			return err
		}
	}
	return nil
}

func (p *policyParser) str(n *yaml.Node, what string) (string, error) {
	n = resolveAlias(n)
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!str" && n.Tag != "!!int") {
		return "", p.errf(n, "%s must be a string", what)
	}
	return n.Value, nil
}

func (p *policyParser) id(n *yaml.Node, what string) (string, error) {
	s, err := p.str(n, what)
	if err != nil {
		return "", err
	}
	if err := CheckID(what, s); err != nil {
		return "", p.errf(n, "%s", trimPrefix(err))
	}
	return s, nil
}

// ids parses a list of identifiers, rejecting duplicates; it also returns the node of each.
func (p *policyParser) ids(n *yaml.Node, what string) ([]string, []*yaml.Node, error) {
	n = resolveAlias(n)
	if n.Kind != yaml.SequenceNode {
		return nil, nil, p.errf(n, "%ss must be a list", what)
	}
	out := make([]string, 0, len(n.Content))
	nodes := make([]*yaml.Node, 0, len(n.Content))
	seen := map[string]int{}
	for _, item := range n.Content {
		s, err := p.id(item, what)
		if err != nil {
			return nil, nil, err
		}
		if first, dup := seen[s]; dup {
			return nil, nil, p.errf(item, "duplicate %s %q (first at line %d)", what, s, first)
		}
		seen[s] = item.Line
		out = append(out, s)
		nodes = append(nodes, resolveAlias(item))
	}
	return out, nodes, nil
}

func (p *policyParser) boolean(n *yaml.Node, what string) (bool, error) {
	n = resolveAlias(n)
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		return false, p.errf(n, "%s must be true or false", what)
	}
	return n.Value == "true", nil
}

func (p *policyParser) list(n *yaml.Node, what string) ([]*yaml.Node, error) {
	n = resolveAlias(n)
	if n.Kind != yaml.SequenceNode {
		return nil, p.errf(n, "%s must be a list", what)
	}
	out := make([]*yaml.Node, len(n.Content))
	for i, c := range n.Content {
		out[i] = resolveAlias(c)
	}
	return out, nil
}

func (p *policyParser) policy(doc *yaml.Node) (Policy, error) {
	root := doc
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		root = doc.Content[0]
	}
	var pol Policy
	var tenantsNode *yaml.Node
	err := p.fields(root, "the policy file", []string{"version", "tenants"}, func(key string, _, v *yaml.Node) error {
		switch key {
		case "version":
			if v.Kind != yaml.ScalarNode || v.Value != "1" {
				return p.errf(v, "unsupported version %q (want 1)", v.Value)
			}
		case "tenants":
			tenantsNode = v
		}
		return nil
	})
	if err != nil {
		return Policy{}, err
	}
	if tenantsNode == nil {
		return Policy{}, p.errf(root, "no tenants: the file must hold a tenants list")
	}
	items, err := p.list(tenantsNode, "tenants")
	if err != nil {
		return Policy{}, err
	}
	seen := map[string]int{}
	for _, item := range items {
		snap, err := p.tenant(item)
		if err != nil {
			return Policy{}, err
		}
		if first, dup := seen[snap.Tenant.ID]; dup {
			return Policy{}, p.errf(item, "duplicate tenant id %q (first at line %d)", snap.Tenant.ID, first)
		}
		seen[snap.Tenant.ID] = item.Line
		pol.Tenants = append(pol.Tenants, snap)
	}
	return pol, nil
}

var (
	tenantFields = []string{"id", "display_name", "features", "trust_ceiling", "limits", "roles", "users", "agents"}
	userFields   = []string{"id", "org", "roles", "disabled"}
	agentFields  = []string{"id", "user", "disabled", "host"}
	limitFields  = []string{"max", "window"}
)

func (p *policyParser) tenant(n *yaml.Node) (Snapshot, error) {
	var (
		snap                  Snapshot
		hasID                 bool
		usersNode, agentsNode *yaml.Node
		roleNodes             = map[string]*yaml.Node{}
	)
	err := p.fields(n, "a tenant", tenantFields, func(key string, _, v *yaml.Node) error {
		var err error
		switch key {
		case "id":
			snap.Tenant.ID, err = p.id(v, "tenant id")
			hasID = true
		case "display_name":
			snap.Tenant.DisplayName, err = p.str(v, "display_name")
		case "features":
			snap.Tenant.Features, _, err = p.ids(v, "feature")
		case "trust_ceiling":
			snap.Tenant.TrustCeiling, err = p.str(v, "trust_ceiling")
			if err == nil && manifest.RiskLevel(snap.Tenant.TrustCeiling) < 0 {
				err = p.errf(v, "trust_ceiling must be one of L0, L1, L2, L3, L4 (the highest risk an answer in an app's own window may approve)")
			}
		case "limits":
			snap.Tenant.Limits, err = p.limits(v)
		case "roles":
			err = p.roles(v, &snap, roleNodes)
		case "users":
			usersNode = v
		case "agents":
			agentsNode = v
		}
		return err
	})
	if err != nil {
		return Snapshot{}, err
	}
	if !hasID {
		return Snapshot{}, p.errf(n, "tenant has no id")
	}
	tenant := snap.Tenant.ID
	for i := range snap.Roles {
		snap.Roles[i].Tenant = tenant
	}
	snap.Tenant.Features = Normalize(snap.Tenant.Features)

	users := map[string]int{}
	if usersNode != nil {
		items, err := p.list(usersNode, "users")
		if err != nil {
			return Snapshot{}, err
		}
		for _, item := range items {
			u, err := p.user(item, tenant, roleNodes)
			if err != nil {
				return Snapshot{}, err
			}
			if first, dup := users[u.ID]; dup {
				return Snapshot{}, p.errf(item, "duplicate user id %q in tenant %q (first at line %d)", u.ID, tenant, first)
			}
			users[u.ID] = item.Line
			snap.Users = append(snap.Users, u)
		}
	}
	if agentsNode != nil {
		items, err := p.list(agentsNode, "agents")
		if err != nil {
			return Snapshot{}, err
		}
		agents := map[string]int{}
		for _, item := range items {
			a, err := p.agent(item, tenant, users)
			if err != nil {
				return Snapshot{}, err
			}
			if first, dup := agents[a.ID]; dup {
				return Snapshot{}, p.errf(item, "duplicate agent id %q in tenant %q (first at line %d)", a.ID, tenant, first)
			}
			agents[a.ID] = item.Line
			snap.Agents = append(snap.Agents, a)
		}
	}
	SortSnapshot(&snap)
	return snap, nil
}

func (p *policyParser) roles(n *yaml.Node, snap *Snapshot, roleNodes map[string]*yaml.Node) error {
	n = resolveAlias(n)
	if n.Kind != yaml.MappingNode {
		return p.errf(n, "roles must be a mapping from role name to a list of permissions")
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name, err := p.id(k, "role name")
		if err != nil {
			return err
		}
		if first, dup := roleNodes[name]; dup {
			return p.errf(k, "duplicate role %q (first at line %d)", name, first.Line)
		}
		roleNodes[name] = k
		perms, _, err := p.ids(v, "permission")
		if err != nil {
			return err
		}
		if len(perms) == 0 {
			return p.errf(k, "role %q grants no permissions", name)
		}
		snap.Roles = append(snap.Roles, Role{Name: name, Permissions: Normalize(perms)})
	}
	return nil
}

// limitKeyExample is a well-formed key of a tenant's limits, for messages.
const limitKeyExample = "ticket.refund/agent-daily-refunds"

// limits parses a tenant's limit overrides: a mapping from
// "<command code>/<limit id>" to max and/or window. Whether the key names
// a declared limit is for CheckPolicy, which knows the manifest.
func (p *policyParser) limits(n *yaml.Node) (map[string]LimitOverride, error) {
	n = resolveAlias(n)
	if n.Kind != yaml.MappingNode {
		return nil, p.errf(n, "limits must be a mapping from \"<command code>/<limit id>\" to max and window, e.g. %q", limitKeyExample)
	}
	out := map[string]LimitOverride{}
	lines := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key, err := p.id(k, "limit key")
		if err != nil {
			return nil, err
		}
		if _, _, ok := SplitLimitKey(key); !ok {
			return nil, p.errf(k, "limit key %q must be \"<command code>/<limit id>\", e.g. %q", key, limitKeyExample)
		}
		if first, dup := lines[key]; dup {
			return nil, p.errf(k, "duplicate limit %q (first at line %d)", key, first)
		}
		lines[key] = k.Line
		var o LimitOverride
		err = p.fields(v, "limit "+strconv.Quote(key), limitFields, func(field string, _, v *yaml.Node) error {
			var err error
			switch field {
			case "max":
				o.Max, err = p.limitMax(v, key)
			case "window":
				o.Window, err = p.limitWindow(v, key)
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		if o.Max == 0 && o.Window == 0 {
			return nil, p.errf(k, "limit %q overrides nothing: set max, window or both", key)
		}
		out[key] = o
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

func (p *policyParser) limitMax(n *yaml.Node, key string) (int64, error) {
	var m int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&m) != nil {
		return 0, p.errf(n, "max of limit %q must be a whole number", key)
	}
	if m <= 0 {
		return 0, p.errf(n, "max of limit %q must be positive (the most calls, or the most of the summed field, per window)", key)
	}
	return m, nil
}

func (p *policyParser) limitWindow(n *yaml.Node, key string) (time.Duration, error) {
	s, err := p.str(n, "window of limit "+strconv.Quote(key))
	if err != nil {
		return 0, err
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, p.errf(n, "window of limit %q must be a duration such as 12h or 90m, not %q", key, s)
	}
	if d <= 0 || d > limit.MaxWindow {
		return 0, p.errf(n, "window of limit %q must be positive and at most %s (31 days), not %s", key, maxWindowText, s)
	}
	return d, nil
}

// maxWindowText is limit.MaxWindow as the policy file spells durations.
var maxWindowText = strconv.FormatInt(int64(limit.MaxWindow/time.Hour), 10) + "h"

func (p *policyParser) user(n *yaml.Node, tenant string, roleNodes map[string]*yaml.Node) (User, error) {
	u := User{Tenant: tenant}
	hasID := false
	err := p.fields(n, "a user", userFields, func(key string, _, v *yaml.Node) error {
		var err error
		switch key {
		case "id":
			u.ID, err = p.id(v, "user id")
			hasID = true
		case "org":
			u.Org, err = p.str(v, "org")
		case "roles":
			var nodes []*yaml.Node
			u.Roles, nodes, err = p.ids(v, "role name")
			for i, r := range u.Roles {
				if err == nil && roleNodes[r] == nil {
					err = p.errf(nodes[i], "role %q is not defined in tenant %q", r, tenant)
				}
			}
		case "disabled":
			u.Disabled, err = p.boolean(v, "disabled")
		}
		return err
	})
	if err != nil {
		return User{}, err
	}
	if !hasID {
		return User{}, p.errf(n, "user has no id")
	}
	u.Roles = Normalize(u.Roles)
	return u, nil
}

func (p *policyParser) agent(n *yaml.Node, tenant string, users map[string]int) (Agent, error) {
	a := Agent{Tenant: tenant}
	var hasID bool
	var userNode *yaml.Node
	err := p.fields(n, "an agent", agentFields, func(key string, _, v *yaml.Node) error {
		var err error
		switch key {
		case "id":
			a.ID, err = p.id(v, "agent id")
			hasID = true
		case "user":
			a.UserID, err = p.id(v, "agent user")
			userNode = v
		case "disabled":
			a.Disabled, err = p.boolean(v, "disabled")
		case "host":
			switch h := AgentHost(v.Value); {
			case v.Kind != yaml.ScalarNode || (h != HostHeadless && h != HostInteractive):
				err = p.errf(v, "host must be %q or %q", HostHeadless, HostInteractive)
			default:
				a.Host = h
			}
		}
		return err
	})
	if err != nil {
		return Agent{}, err
	}
	if a.Host == "" {
		a.Host = HostHeadless
	}
	if !hasID {
		return Agent{}, p.errf(n, "agent has no id")
	}
	if userNode == nil {
		return Agent{}, p.errf(n, "agent %q has no user", a.ID)
	}
	if _, ok := users[a.UserID]; !ok {
		return Agent{}, p.errf(userNode, "agent %q acts for unknown user %q (not listed in tenant %q)", a.ID, a.UserID, tenant)
	}
	return a, nil
}

// trimPrefix drops the package prefix of a directory error for use inside a PolicyError.
func trimPrefix(err error) string {
	s := err.Error()
	const prefix = "directory: invalid value: "
	if len(s) > len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):]
	}
	return s
}
