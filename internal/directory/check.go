package directory

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/suggest"
)

// CheckFinding is one thing [CheckPolicy] found in a policy file, measured
// against the commands of a manifest.
type CheckFinding struct {
	// Tenant is the tenant of the file the finding is about.
	Tenant string
	// Warning is false for a finding that refuses the file: applying it
	// would leave commands that can be requested and never approved.
	Warning bool
	// Msg says what is wrong and how to fix it.
	Msg string
}

// String renders the finding as "error: tenant "acme": …" or "warning: …".
func (f CheckFinding) String() string {
	sev := "error"
	if f.Warning {
		sev = "warning"
	}
	return fmt.Sprintf("%s: tenant %q: %s", sev, f.Tenant, f.Msg)
}

// CheckPolicy checks a parsed policy against the commands of the manifest
// it governs, tenant by tenant, errors first:
//
//   - error: a command whose approver policy is PERMISSION_HOLDER, that some
//     enabled user of the tenant may request (they hold its permissions and
//     the tenant has its feature), and whose approver permission no other
//     enabled user holds. Such a request waits for an approval nobody can
//     give; four-eyes means the requester never approves their own call.
//   - error: a limit override whose key "<command code>/<limit id>" names no
//     command of the manifest, or a command that declares no limit with
//     that id. The override would silently govern nothing, so the nearest
//     declared "<code>/<id>" is suggested.
//   - warning: a role grants a permission that no command requires, no
//     approver policy names and that is not in platform (the permissions
//     Mandate's own services check, e.g. audit.read). Probably a typo, so
//     the nearest known name is suggested; only a warning, because a
//     directory may outlive a command or serve permissions of another
//     manifest, and refusing it would block every later policy change.
//   - warning: a tenant feature that no command requires, for the same
//     reasons.
func CheckPolicy(pol Policy, commands []*manifest.Command, platform []string) []CheckFinding {
	known := map[string]bool{}
	features := map[string]bool{}
	for _, p := range platform {
		known[p] = true
	}
	for _, c := range commands {
		for _, p := range c.Permissions {
			known[p] = true
		}
		if c.Approver.Kind == approverPermissionHolder && c.Approver.Permission != "" {
			known[c.Approver.Permission] = true
		}
		if c.RequiredFeature != "" {
			features[c.RequiredFeature] = true
		}
	}
	knownNames := sortedKeys(known)
	featureNames := sortedKeys(features)
	limits := declaredLimits(commands)

	var errs, warns []CheckFinding
	for _, snap := range pol.Tenants {
		tenant := snap.Tenant.ID
		errs = append(errs, unapprovable(snap, commands)...)
		errs = append(errs, undeclaredLimits(snap, limits)...)
		for _, r := range snap.Roles {
			for _, p := range r.Permissions {
				if !known[p] {
					warns = append(warns, CheckFinding{Tenant: tenant, Warning: true, Msg: fmt.Sprintf(
						"role %q grants %q, which no command requires, no approver policy names and no Mandate service checks%s; fix the name, or remove it if nothing needs it",
						r.Name, p, suggestion(p, knownNames))})
				}
			}
		}
		for _, f := range snap.Tenant.Features {
			if !features[f] {
				warns = append(warns, CheckFinding{Tenant: tenant, Warning: true, Msg: fmt.Sprintf(
					"feature %q is required by no command%s; fix the name, or remove it if nothing needs it",
					f, suggestion(f, featureNames))})
			}
		}
	}
	return append(errs, warns...)
}

// approverPermissionHolder is the manifest's name of the approver kind
// that names a permission.
const approverPermissionHolder = manifest.ApproverPermissionHolder

// unapprovable finds the commands of a tenant that some user may request
// and no one else may approve.
func unapprovable(snap Snapshot, commands []*manifest.Command) []CheckFinding {
	roles := map[string][]string{}
	for _, r := range snap.Roles {
		roles[r.Name] = r.Permissions
	}
	held := map[string]map[string]bool{} // enabled user → permissions
	var users []string
	for _, u := range snap.Users {
		if u.Disabled {
			continue
		}
		perms := map[string]bool{}
		for _, r := range u.Roles {
			for _, p := range roles[r] {
				perms[p] = true
			}
		}
		held[u.ID] = perms
		users = append(users, u.ID)
	}
	var out []CheckFinding
	for _, c := range commands {
		perm := c.Approver.Permission
		if c.Approver.Kind != approverPermissionHolder || perm == "" {
			continue
		}
		if c.RequiredFeature != "" && !slices.Contains(snap.Tenant.Features, c.RequiredFeature) {
			continue // nobody in the tenant may request it
		}
		var requesters, approvers []string
		for _, u := range users {
			if holdsAll(held[u], c.Permissions) {
				requesters = append(requesters, u)
			}
			if held[u][perm] {
				approvers = append(approvers, u)
			}
		}
		var stranded []string
		for _, r := range requesters {
			if !slices.ContainsFunc(approvers, func(a string) bool { return a != r }) {
				stranded = append(stranded, r)
			}
		}
		if len(stranded) == 0 {
			continue
		}
		who := "no enabled user holds it"
		if len(approvers) > 0 {
			who = fmt.Sprintf("only %s holds it, who may not approve their own request", strings.Join(approvers, ", "))
		}
		out = append(out, CheckFinding{Tenant: snap.Tenant.ID, Msg: fmt.Sprintf(
			"%s is approved by a holder of %q and %s: requests by %s would wait for an approval nobody can give; grant %q through a role held by another enabled user, or stop granting %v to them",
			c.Code, perm, who, strings.Join(stranded, ", "), perm, c.Permissions)})
	}
	return out
}

// declaredLimits maps every command code of the manifest to the ids of
// the limits it declares (none: an empty list).
func declaredLimits(commands []*manifest.Command) map[string][]string {
	out := make(map[string][]string, len(commands))
	for _, c := range commands {
		ids := []string{}
		for _, l := range c.Limits {
			ids = append(ids, l.ID)
		}
		out[c.Code] = ids
	}
	return out
}

// undeclaredLimits finds the limit overrides of a tenant whose key names
// no limit a command of the manifest declares, in key order.
func undeclaredLimits(snap Snapshot, declared map[string][]string) []CheckFinding {
	var known []string
	for code, ids := range declared {
		for _, id := range ids {
			known = append(known, LimitKey(code, id))
		}
	}
	sort.Strings(known)
	var out []CheckFinding
	for _, key := range slices.Sorted(maps.Keys(snap.Tenant.Limits)) {
		code, id, _ := SplitLimitKey(key)
		ids, ok := declared[code]
		var why string
		switch {
		case !ok:
			why = fmt.Sprintf("no command %s is in the manifest", code)
		case len(ids) == 0:
			why = fmt.Sprintf("%s declares no limits", code)
		case !slices.Contains(ids, id):
			why = fmt.Sprintf("%s declares no limit %q (it declares %s)", code, id, strings.Join(ids, ", "))
		default:
			continue
		}
		out = append(out, CheckFinding{Tenant: snap.Tenant.ID, Msg: fmt.Sprintf(
			"limit override %q overrides nothing: %s%s; fix the key to \"<command code>/<limit id>\" of a declared limit, or remove it",
			key, why, suggestion(key, known))})
	}
	return out
}

func holdsAll(held map[string]bool, perms []string) bool {
	for _, p := range perms {
		if !held[p] {
			return false
		}
	}
	return true
}

// suggestion names the nearest of names to s, when it is near enough to be
// a typo of it: at most a third of s's length in edits (at least one).
func suggestion(s string, names []string) string {
	if n := suggest.Nearest(s, names, len(s)/3); n != "" {
		return fmt.Sprintf(" (did you mean %q?)", n)
	}
	return ""
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
