// Package directory is Mandate's policy directory: it answers whether a principal (a user acting
// directly, or a registered agent acting for a user) is active, which permissions it holds,
// which features its tenant is entitled to, and the tenant's own ceilings and windows for the
// limits commands declare.
//
// # Model
//
// Everything is scoped to a tenant: roles (name → permissions), users (org, roles, disabled)
// and agents (the user they act for, disabled) belong to exactly one tenant, and the same id in
// two tenants names two unrelated entries. No lookup or write ever crosses tenants. [Resolve]
// applies the rules: the tenant must exist; the user must exist in it and be enabled; an agent
// must be registered in the same tenant, act for that very user and be enabled. An agent's
// permissions are exactly its user's, so disabling a user disables all of its agents too.
// Inactive principals come back as a [Resolution] with Active false and a stable Reason
// (tenant.unknown, user.unknown, user.disabled, agent.not_registered, agent.wrong_user,
// agent.disabled), never as an error.
//
// # Storage and freshness
//
// [Store] has a memory and a Postgres implementation, both held to the same behaviour by the
// directorytest conformance suite. Changes take effect on the next call: [Resolve] reads the
// store every time, and a [Cache] in front of it drops a tenant's entries as soon as the store
// announces a change to it ([Store.Watch]). Changes made through a store are announced, and
// acknowledged by every Cache on it, before Update returns. Changes made through another
// process reach a Cache when its NOTIFY arrives; the TTL only bounds staleness while the
// notification connection is down.
//
// # Policy files
//
// [Apply] seeds and updates the directory from YAML:
//
//	version: 1                      # optional; 1 is the only version
//	tenants:
//	  - id: acme                    # required, unique in the file
//	    display_name: Acme Corp     # optional
//	    features: [refunds, expenses]
//	    trust_ceiling: L3           # optional, L0 … L4, default L2
//	    limits:                     # optional: this tenant's own ceiling or window of a limit
//	      ticket.refund/agent-daily-refunds:  # "<command code>/<limit id>" the manifest declares
//	        max: 10000              # optional, a positive whole number; default: the declared max
//	        window: 12h             # optional, a Go duration, at most 744h (31 days); default: the
//	                                # declared window. At least one of max and window.
//	    roles:                      # role name → permissions (at least one)
//	      support: [ticket.read, expense.report.submit]
//	      lead: [ticket.read, ticket.assign]
//	    users:
//	      - id: alice               # required, unique in the tenant
//	        org: support
//	        roles: [support, lead]  # roles defined above, in this tenant
//	      - id: bob
//	        disabled: true          # optional, default false
//	    agents:
//	      - id: support-bot         # required, unique in the tenant
//	        user: alice             # required, a user listed in this tenant
//	        disabled: false         # optional
//	        host: interactive       # optional, headless (the default) or interactive
//
// A limit override replaces, for the tenant's principals, the max and/or the window that the
// manifest declares for one limit of one command ([Tenant.Limits], [Resolution.Limits]); what
// the limit counts, per whom, and what happens past it stay as declared. [CheckPolicy] refuses
// an override whose key names no limit of the manifest's commands. Like the rest of a tenant,
// its limits are the file's: an override the file no longer lists is dropped.
//
// The file is the complete desired state of each tenant it names: entries are created or
// updated to match it; a role the file does not list is deleted (and dropped from its holders);
// a user or agent the file does not list is disabled, not deleted, so that its id stays
// reserved and audit records keep pointing at something. Listing it again re-enables it.
// Tenants the file does not name are left alone. Applying the same file twice changes nothing,
// and the second [Summary] reports zero changes.
//
// The whole file is checked before anything is written: unknown fields, repeated fields,
// duplicate tenant, user, agent, role, feature, permission or limit ids, empty or malformed
// ids, limit keys that are not "<command code>/<limit id>", limit overrides that set neither
// max nor window, a max that is not a positive whole number, a window that is not a duration
// in (0, 744h], roles granting nothing, users holding roles the tenant does not define, and
// agents acting for users the tenant does not list are refused with a [*PolicyError] that
// names the line, e.g. "policy.yaml:12: unknown field "rolez"". For YAML syntax errors the line
// is the one the YAML parser reports, which for some errors is where the enclosing block
// starts. All writes happen in one transaction, so a refused or failed apply changes nothing.
package directory
