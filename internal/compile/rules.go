package compile

// Severity says whether a finding refuses the build.
type Severity int

const (
	// SeverityError refuses the build: nothing is written.
	SeverityError Severity = iota
	// SeverityWarning is reported and the build goes on: the declaration is
	// governed safely as written, but it probably does not say what its
	// author meant.
	SeverityWarning
)

// String names the severity as docs/build-rules.md and the findings do.
func (s Severity) String() string {
	if s == SeverityWarning {
		return "warning"
	}
	return "error"
}

// Rule is one build rule: its stable id, whether it refuses the build, what
// it checks and how to fix a declaration it finds.
type Rule struct {
	// ID is the stable id, MANDATE1xxx. Ids are never reused.
	ID string
	// Severity says whether a finding of the rule refuses the build.
	Severity Severity
	// Checks says what the rule finds, in one line.
	Checks string
	// Fix says how to change a declaration it finds, in one line.
	Fix string
}

// Rules is every build rule, in id order: the one table that defines each
// rule's severity, and that docs/build-rules.md is generated from (see
// TestBuildRulesDoc).
var Rules = []Rule{
	{"MANDATE1001", SeverityError,
		"`confirmation: CONFIRMATION_NEVER` on a command with side effects or risk L3+",
		"remove it (the default asks a human where the risk demands) or set CONFIRMATION_REQUIRED"},
	{"MANDATE1002", SeverityError,
		"`reversible: true` without a `recall`, `recall` without `reversible`, or a `recall` that names no other command of the manifest",
		"name the command that undoes this one, or set `reversible: false` and drop `recall`"},
	{"MANDATE1003", SeverityError,
		"missing `code`, `risk` or `agent_hint`",
		"declare them: a dotted code, a risk L0…L4, one sentence for the LLM"},
	{"MANDATE1004", SeverityError,
		"malformed `code` (two or more dot-separated lower-case segments, at most 128 characters)",
		"rename it, e.g. `expense.report.submit`"},
	{"MANDATE1005", SeverityError,
		"two commands declare the same `code`",
		"give every command its own code"},
	{"MANDATE1006", SeverityError,
		"malformed side effect (kebab case) or permission (dotted lower case) names",
		"use names like `payment-gateway` and `payment.refund`"},
	{"MANDATE1007", SeverityError,
		"an L4 command without an `approver` policy",
		"declare who approves, e.g. `approver: {kind: APPROVER_KIND_PERMISSION_HOLDER, permission: \"payment.approve\"}`"},
	{"MANDATE1008", SeverityError,
		"side effects with no `permissions`: any authenticated principal could cause them",
		"declare the permission the caller needs"},
	{"MANDATE1009", SeverityError,
		"a `subject_field` or separation-of-duties `field` that is not a top-level scalar field of the request (of both requests, for separation of duties)",
		"name an existing top-level scalar field"},
	{"MANDATE1010", SeverityError,
		"`separation_of_duties` without `field` or `conflicts_with`, or conflicting with an unknown command",
		"declare both, naming commands of the manifest"},
	{"MANDATE1011", SeverityError,
		"a streaming RPC declared as a command",
		"make the method unary"},
	{"MANDATE1012", SeverityError,
		"a PERMISSION_HOLDER approver without a well-formed `permission`",
		"name the permission the approver must hold"},
	{"MANDATE1013", SeverityError,
		"an example that does not decode and validate as the command's request",
		"fix the example's JSON (proto field names, protovalidate rules)"},
	{"MANDATE1014", SeverityError,
		"a `deadline` outside (0, 1h]",
		"declare a positive deadline of at most one hour"},
	{"MANDATE1015", SeverityError,
		"risk L0 (read-only) with side effects",
		"raise the risk or remove the side effects"},
	{"MANDATE1016", SeverityError,
		"a `subject_field` that names a field marked `(mandate.v1.field).sensitive`: the subject is written in clear to every audit row, where sensitive values are redacted",
		"name a non-sensitive identifier of the subject (a ticket or customer id) or drop `subject_field`"},
	{"MANDATE1017", SeverityWarning,
		"a `recall` command that is L3+, or has side effects and is not `idempotent`: an undo riskier than what it undoes, or unsafe to retry. A warning: the recall is still confirmed and approved by its own declaration",
		"lower the recall's risk or make it idempotent; if undoing needs a sign-off, set `reversible: false` on the original and drop `recall`"},
	{"MANDATE1018", SeverityError,
		"a `recall` that requires a permission its original command does not: a caller of the original may be unable to undo it, although `reversible: true` waived the default confirmation on that promise",
		"require the permission on the original too, drop it from the recall, or set `reversible: false` and drop `recall`"},
	{"MANDATE1019", SeverityError,
		"a condition whose CEL expression does not compile against the request message (an unknown field, a type error) or is not a boolean",
		"write a CEL boolean over `request` (the typed request) and `principal` (mandate.v1.ConditionPrincipal), e.g. `request.amount.amount_minor > 2000`"},
	{"MANDATE1020", SeverityError,
		"a condition without a well-formed `id` (unique within the command), an `effect` or a `description`",
		"give each condition a kebab-case id such as `large-refund`, an effect (REQUIRE_CONFIRMATION or DENY) and the sentence a human reads"},
	{"MANDATE1021", SeverityError,
		"`confirmation: CONFIRMATION_CONDITIONAL` on an L4 command, or without any condition of effect REQUIRE_CONFIRMATION",
		"declare the condition under which a human is asked, or drop the value (L4 calls are always approved)"},
	{"MANDATE1022", SeverityError,
		"an `approver_hint` with markup (backticks, asterisks, underscores, angle or square brackets, hashes), a line break, or more than 300 bytes: the approval page shows it as written, to the human who decides",
		"write one or two plain sentences of what the call does, in the approver's words, e.g. \"Sends money back to the customer's card; it cannot be taken back.\""},
	{"MANDATE1023", SeverityError,
		"a limit without a well-formed `id` (unique among the command's limits and conditions), a scope (`per`), a `window` within (0, 31 days], a positive `max`, `when_exhausted` or a `description`, or whose `sum_field` is not a singular integer field of the request or whose `group_field` is not a singular string or enum field",
		"declare e.g. `limits: {id: \"agent-daily-refunds\" per: LIMIT_SCOPE_AGENT window: {seconds: 86400} max: 50000 sum_field: \"amount.amount_minor\" group_field: \"amount.currency_code\" when_exhausted: LIMIT_EXHAUSTED_ESCALATE description: \"an agent refunds at most 500.00 a day per currency\"}`"},
}

// ruleByID indexes Rules.
var ruleByID = func() map[string]Rule {
	m := make(map[string]Rule, len(Rules))
	for _, r := range Rules {
		m[r.ID] = r
	}
	return m
}()

// severityOf is the severity of a rule of the table. A rule missing from
// it refuses the build (the safe reading); TestEveryRuleIsInTheTable keeps
// the table complete.
func severityOf(id string) Severity {
	if r, ok := ruleByID[id]; ok {
		return r.Severity
	}
	return SeverityError
}
