// Package compile turns protobuf files carrying Mandate declarations into a
// manifest and a descriptor set, refusing unsafe declarations. It is the
// engine of protoc-gen-mandate; it runs on plain descriptors, so tests and
// other tools can call it without buf.
package compile

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/durationpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/condition"
	"github.com/mandate-dev/mandate/internal/facts"
	"github.com/mandate-dev/mandate/internal/limit"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/schema"
	"github.com/mandate-dev/mandate/internal/schema/jsonschema"
)

// Finding is one declaration a rule found: refused, or warned about.
type Finding struct {
	// Rule is the stable rule id, e.g. MANDATE1001.
	Rule string
	// Severity is the rule's, from [Rules].
	Severity Severity
	// Code is the command code ("" when the code itself is missing).
	Code string
	// Method is the RPC, e.g. examples.helpdesk.v1.HelpdeskService.IssueRefund.
	Method string
	// Message says what is wrong and how to fix it.
	Message string
}

func (f Finding) String() string {
	code := f.Code
	if code == "" {
		code = "(no code)"
	}
	rule := f.Rule
	if f.Severity == SeverityWarning {
		rule += " (warning)"
	}
	return fmt.Sprintf("%s %s (%s): %s", rule, code, f.Method, f.Message)
}

// Error lists every finding of a refused build: the errors, then the
// warnings the same build found.
type Error struct {
	Findings []Finding
}

func (e *Error) Error() string {
	lines := make([]string, len(e.Findings))
	refused := 0
	for i, f := range e.Findings {
		lines[i] = f.String()
		if f.Severity == SeverityError {
			refused++
		}
	}
	return fmt.Sprintf("protoc-gen-mandate refused %d declaration(s):\n%s", refused, strings.Join(lines, "\n"))
}

// Output is what a successful compilation produces.
type Output struct {
	// Manifest is the canonical manifest JSON.
	Manifest []byte
	// DescriptorSet is the deterministic binary FileDescriptorSet (all
	// files, imports included, without source info) the manifest refers to.
	DescriptorSet []byte
	// Warnings are the findings of warning rules; they did not refuse the
	// build, and protoc-gen-mandate prints them.
	Warnings []Finding
}

var (
	codePattern       = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$`)
	sideEffectPattern = regexp.MustCompile(`^[a-z][a-z0-9]*(-[a-z0-9]+)*$`)
	permissionPattern = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$`)
)

const maxCodeLen = 128

// Compile reads the commands declared in the files named by targets (every
// file of fds when targets is empty) and returns the manifest, or *Error.
// fds must hold every file and its imports in dependency order, as a
// CodeGeneratorRequest or `buf build` provides them.
func Compile(fds *descriptorpb.FileDescriptorSet, targets []string) (*Output, error) {
	// Re-read through the wire format so custom options are resolved with
	// the linked-in extension types whatever produced fds.
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(fds)
	if err != nil {
		return nil, fmt.Errorf("compile: %w", err)
	}
	set := new(descriptorpb.FileDescriptorSet)
	if err := (proto.UnmarshalOptions{Resolver: protoregistry.GlobalTypes}).Unmarshal(raw, set); err != nil {
		return nil, fmt.Errorf("compile: %w", err)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		return nil, fmt.Errorf("compile: %w", err)
	}
	want := map[string]bool{}
	for _, t := range targets {
		want[t] = true
	}
	c := &compiler{files: files}
	for _, fdp := range set.GetFile() {
		if len(want) > 0 && !want[fdp.GetName()] {
			continue
		}
		fd, err := files.FindFileByPath(fdp.GetName())
		if err != nil {
			return nil, fmt.Errorf("compile: %w", err)
		}
		services := fd.Services()
		for i := range services.Len() {
			methods := services.Get(i).Methods()
			for j := range methods.Len() {
				if err := c.method(methods.Get(j)); err != nil {
					return nil, err
				}
			}
		}
	}
	c.crossCheck()
	sort.SliceStable(c.findings, func(i, j int) bool {
		a, b := c.findings[i], c.findings[j]
		if a.Severity != b.Severity {
			return a.Severity < b.Severity // errors first
		}
		if a.Code != b.Code {
			return a.Code < b.Code
		}
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		return a.Message < b.Message
	})
	var warnings []Finding
	for _, f := range c.findings {
		if f.Severity == SeverityError {
			return nil, &Error{Findings: c.findings}
		}
		warnings = append(warnings, f)
	}
	descriptors, err := descriptorSet(set)
	if err != nil {
		return nil, err
	}
	sort.Slice(c.commands, func(i, j int) bool { return c.commands[i].Code < c.commands[j].Code })
	m := &manifest.Manifest{
		DescriptorSetDigest: manifest.DigestOf(descriptors),
		Commands:            c.commands,
	}
	if m.Commands == nil {
		m.Commands = []*manifest.Command{}
	}
	out, err := manifest.Encode(m)
	if err != nil {
		return nil, err
	}
	return &Output{Manifest: out, DescriptorSet: descriptors, Warnings: warnings}, nil
}

// descriptorSet strips source info and encodes deterministically.
func descriptorSet(set *descriptorpb.FileDescriptorSet) ([]byte, error) {
	clean := proto.Clone(set).(*descriptorpb.FileDescriptorSet)
	for _, f := range clean.GetFile() {
		f.SourceCodeInfo = nil
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(clean)
	if err != nil {
		return nil, fmt.Errorf("compile: descriptor set: %w", err)
	}
	return b, nil
}

type compiler struct {
	files *protoregistry.Files
	// envs are the condition environments, one per request message.
	envs     map[protoreflect.FullName]*condition.Env
	commands []*manifest.Command
	methods  map[string]protoreflect.MethodDescriptor
	findings []Finding
}

// refuse records a finding of rule; the rule's severity decides whether it
// refuses the build.
// maxApproverHint bounds CommandOptions.approver_hint.
const maxApproverHint = 300

func (c *compiler) refuse(rule string, md protoreflect.MethodDescriptor, code, format string, args ...any) {
	c.findings = append(c.findings, Finding{
		Rule:     rule,
		Severity: severityOf(rule),
		Code:     code,
		Method:   string(md.FullName()),
		Message:  fmt.Sprintf(format, args...),
	})
}

var riskNames = map[mandatev1.Risk]string{
	mandatev1.Risk_RISK_L0: "L0", mandatev1.Risk_RISK_L1: "L1", mandatev1.Risk_RISK_L2: "L2",
	mandatev1.Risk_RISK_L3: "L3", mandatev1.Risk_RISK_L4: "L4",
}

func (c *compiler) method(md protoreflect.MethodDescriptor) error {
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok || !proto.HasExtension(opts, mandatev1.E_Command) {
		return nil // not a command
	}
	decl, _ := proto.GetExtension(opts, mandatev1.E_Command).(*mandatev1.CommandOptions)
	code := decl.GetCode()

	switch {
	case code == "":
		c.refuse("MANDATE1003", md, code, "missing `code`; set a dotted lower-case name such as `ticket.refund`")
	case len(code) > maxCodeLen || !codePattern.MatchString(code):
		c.refuse("MANDATE1004", md, code, "malformed `code` %q; use at least two dot-separated lower-case segments of letters, digits and underscores, at most %d characters, e.g. `expense.report.submit`", code, maxCodeLen)
	}
	risk, riskOK := riskNames[decl.GetRisk()]
	if !riskOK {
		c.refuse("MANDATE1003", md, code, "missing `risk`; declare RISK_L0 (read) … RISK_L4 (irreversible, high impact)")
	}
	if strings.TrimSpace(decl.GetAgentHint()) == "" {
		c.refuse("MANDATE1003", md, code, "missing `agent_hint`; write one sentence for an LLM: the intent, the preconditions to check, the recall command if any")
	}
	if h := decl.GetApproverHint(); strings.ContainsAny(h, "`*_<>[]#\n\r") || len(h) > maxApproverHint {
		c.refuse("MANDATE1022", md, code, "`approver_hint` must be plain text of at most %d bytes on one line: no backticks, asterisks, underscores, angle or square brackets, hashes or line breaks; the approval page shows it as written", maxApproverHint)
	}
	if md.IsStreamingClient() || md.IsStreamingServer() {
		c.refuse("MANDATE1011", md, code, "streaming RPCs cannot be commands; make the method unary")
	}
	level := int(decl.GetRisk()) - 1
	sideEffects := decl.GetSideEffects()
	for _, se := range sideEffects {
		if !sideEffectPattern.MatchString(se) {
			c.refuse("MANDATE1006", md, code, "side effect %q is not lower-case kebab case; use names like `payment-gateway`", se)
		}
	}
	for _, p := range decl.GetPermissions() {
		if !permissionPattern.MatchString(p) {
			c.refuse("MANDATE1006", md, code, "permission %q is malformed; use dotted lower-case names like `payment.refund`", p)
		}
	}
	if decl.GetConfirmation() == mandatev1.Confirmation_CONFIRMATION_NEVER && (len(sideEffects) > 0 || level >= 3) {
		c.refuse("MANDATE1001", md, code, "`confirmation: CONFIRMATION_NEVER` on a command with side effects or risk L3+; remove it (the default asks a human where the risk demands) or set CONFIRMATION_REQUIRED")
	}
	if decl.GetReversible() && decl.GetRecall() == "" {
		c.refuse("MANDATE1002", md, code, "`reversible: true` without `recall`; name the command that undoes this one, or set reversible to false")
	}
	if !decl.GetReversible() && decl.GetRecall() != "" {
		c.refuse("MANDATE1002", md, code, "`recall` is set but `reversible` is false; set reversible to true or remove recall")
	}
	if level == 4 && decl.GetApprover() == nil {
		c.refuse("MANDATE1007", md, code, "L4 command without an `approver` policy; declare who may approve, e.g. `approver: {kind: APPROVER_KIND_PERMISSION_HOLDER, permission: \"payment.approve\"}`")
	}
	if a := decl.GetApprover(); a.GetKind() == mandatev1.ApproverKind_APPROVER_KIND_PERMISSION_HOLDER && !permissionPattern.MatchString(a.GetPermission()) {
		c.refuse("MANDATE1012", md, code, "approver kind PERMISSION_HOLDER needs a well-formed `permission` the approver must hold")
	}
	if len(sideEffects) > 0 && len(decl.GetPermissions()) == 0 {
		c.refuse("MANDATE1008", md, code, "side effects %v but no `permissions`: any authenticated principal could cause them; declare the permission the caller needs", sideEffects)
	}
	if level == 0 && len(sideEffects) > 0 {
		c.refuse("MANDATE1015", md, code, "risk L0 means read-only, but side effects %v are declared; raise the risk or remove the side effects", sideEffects)
	}
	if f := decl.GetSubjectField(); f != "" && !topLevelScalar(md.Input(), f) {
		c.refuse("MANDATE1009", md, code, "`subject_field` %q is not a top-level scalar field of %s", f, md.Input().FullName())
	} else if f != "" && facts.IsSensitive(md.Input().Fields().ByName(protoreflect.Name(f))) {
		c.refuse("MANDATE1016", md, code, "`subject_field` %q is marked sensitive, but the subject is written in clear to every audit row (the audit redacts sensitive arguments, not the subject); name a non-sensitive identifier of the subject, such as a ticket or customer id, or drop subject_field", f)
	}
	if sod := decl.GetSeparationOfDuties(); sod != nil {
		if sod.GetField() == "" || len(sod.GetConflictsWith()) == 0 {
			c.refuse("MANDATE1010", md, code, "`separation_of_duties` needs both `conflicts_with` and `field`")
		} else if !topLevelScalar(md.Input(), sod.GetField()) {
			c.refuse("MANDATE1009", md, code, "separation_of_duties `field` %q is not a top-level scalar field of %s", sod.GetField(), md.Input().FullName())
		}
	}
	deadline := ""
	if d := decl.GetDeadline(); d != nil {
		dur := d.AsDuration()
		if !d.IsValid() || dur <= 0 || dur > time.Hour {
			c.refuse("MANDATE1014", md, code, "`deadline` must be positive and at most 1h")
		} else {
			deadline = jsonDuration(dur)
		}
	}
	examples := c.examples(md, code, decl.GetExamples())
	conditions := c.conditions(md, code, decl)
	limits := c.limits(md, code, decl, conditions)

	in, err := jsonschema.Build(md.Input(), jsonschema.Input)
	if err != nil {
		return fmt.Errorf("compile: %s input schema: %w", md.FullName(), err)
	}
	out, err := jsonschema.Build(md.Output(), jsonschema.Output)
	if err != nil {
		return fmt.Errorf("compile: %s output schema: %w", md.FullName(), err)
	}
	inJSON, err := manifest.Canonical(in, false)
	if err != nil {
		return err
	}
	outJSON, err := manifest.Canonical(out, false)
	if err != nil {
		return err
	}

	cmd := &manifest.Command{
		Code:                 code,
		DisplayName:          decl.GetDisplayName(),
		AgentHint:            strings.TrimSpace(decl.GetAgentHint()),
		ApproverHint:         strings.TrimSpace(decl.GetApproverHint()),
		Description:          leadingComment(md),
		Risk:                 risk,
		Idempotent:           decl.GetIdempotent(),
		Reversible:           decl.GetReversible(),
		Recall:               decl.GetRecall(),
		SideEffects:          sortedCopy(sideEffects),
		Permissions:          sortedCopy(decl.GetPermissions()),
		RequiredFeature:      decl.GetRequiredFeature(),
		Confirmation:         confirmationName(decl.GetConfirmation()),
		ConfirmationRequired: confirmationRequired(decl, level),
		Approver:             approver(decl.GetApprover()),
		SubjectField:         decl.GetSubjectField(),
		Lifecycle:            lifecycleName(decl.GetLifecycle()),
		Deadline:             deadline,
		Examples:             examples,
		Conditions:           conditions,
		Limits:               limits,
		RPC:                  rpcOf(md),
		SensitiveFields:      nonNil(facts.SensitivePaths(md.Input())),
		InputSchema:          inJSON,
		OutputSchema:         outJSON,
	}
	if cmd.DisplayName == "" {
		cmd.DisplayName = code
	}
	if sod := decl.GetSeparationOfDuties(); sod != nil {
		cmd.SeparationOfDuties = &manifest.SeparationOfDuties{
			ConflictsWith: sortedCopy(sod.GetConflictsWith()),
			Field:         sod.GetField(),
		}
	}
	c.commands = append(c.commands, cmd)
	if c.methods == nil {
		c.methods = map[string]protoreflect.MethodDescriptor{}
	}
	if code != "" {
		if _, dup := c.methods[code]; dup {
			c.refuse("MANDATE1005", md, code, "duplicate `code`; %s already declares it; every command needs its own code", c.methods[code].FullName())
		} else {
			c.methods[code] = md
		}
	}
	return nil
}

// crossCheck applies the rules that relate commands to each other.
func (c *compiler) crossCheck() {
	for _, cmd := range c.commands {
		md := c.methods[cmd.Code]
		if md == nil {
			continue
		}
		if cmd.Recall != "" {
			switch recall, ok := c.methods[cmd.Recall]; {
			case !ok:
				c.refuse("MANDATE1002", md, cmd.Code, "`recall` names %q, which is not a command of this manifest; declare it or fix the code", cmd.Recall)
			case recall == md:
				c.refuse("MANDATE1002", md, cmd.Code, "`recall` names the command itself; name the command that undoes it")
			default:
				c.checkRecall(md, cmd)
			}
		}
		if sod := cmd.SeparationOfDuties; sod != nil {
			for _, other := range sod.ConflictsWith {
				omd, ok := c.methods[other]
				switch {
				case !ok:
					c.refuse("MANDATE1010", md, cmd.Code, "separation_of_duties conflicts with %q, which is not a command of this manifest", other)
				case sod.Field != "" && topLevelScalar(md.Input(), sod.Field) && !topLevelScalar(omd.Input(), sod.Field):
					c.refuse("MANDATE1009", md, cmd.Code, "separation_of_duties `field` %q does not exist in %s's request %s", sod.Field, other, omd.Input().FullName())
				}
			}
		}
	}
}

// checkRecall applies the rules on what a command's recall may be: no
// riskier than an undo should be (a warning: the recall is governed by its
// own declaration anyway), and callable by whoever may call the original
// (an error: `reversible: true` waived the original's default confirmation
// on the promise that its caller can undo it).
func (c *compiler) checkRecall(md protoreflect.MethodDescriptor, cmd *manifest.Command) {
	var recall *manifest.Command
	for _, other := range c.commands {
		if other.Code == cmd.Recall {
			recall = other
			break
		}
	}
	if recall == nil {
		return
	}
	if level := manifest.RiskLevel(recall.Risk); level >= 3 {
		c.refuse("MANDATE1017", md, cmd.Code, "the recall %s is risk %s: an undo that itself needs a human's confirmation or approval (warning only: it still gets them); lower the recall's risk, or, if undoing really needs a sign-off, set reversible to false and drop recall", recall.Code, recall.Risk)
	}
	if len(recall.SideEffects) > 0 && !recall.Idempotent {
		c.refuse("MANDATE1017", md, cmd.Code, "the recall %s has side effects %v and is not idempotent: an agent retrying the undo may apply it twice (warning only); make the recall idempotent (`idempotent: true`, keyed on the subject) or set reversible to false and drop recall", recall.Code, recall.SideEffects)
	}
	have := map[string]bool{}
	for _, p := range cmd.Permissions {
		have[p] = true
	}
	var missing []string
	for _, p := range recall.Permissions {
		if !have[p] {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		c.refuse("MANDATE1018", md, cmd.Code, "the recall %s requires %v, which %s does not, so a caller of %s may be unable to undo it, though `reversible: true` waived its default confirmation on that promise; require %v on %s too, drop it from the recall, or set reversible to false and drop recall", recall.Code, missing, cmd.Code, cmd.Code, missing, cmd.Code)
	}
}

// examples decodes and validates every declared example with the same
// decoder the executor uses.
func (c *compiler) examples(md protoreflect.MethodDescriptor, code string, exs []*mandatev1.Example) []manifest.Example {
	out := []manifest.Example{}
	if len(exs) == 0 {
		return out
	}
	dec, err := schema.NewDecoder(nil, schema.Limits{})
	if err != nil {
		c.refuse("MANDATE1013", md, code, "cannot build the example decoder: %v", err)
		return out
	}
	for i, ex := range exs {
		if _, err := dec.Decode(md.Input(), []byte(ex.GetInput())); err != nil {
			var inv *schema.InvalidError
			if errors.As(err, &inv) {
				c.refuse("MANDATE1013", md, code, "example %d (%q) is not a valid %s: %v", i+1, ex.GetDescription(), md.Input().Name(), inv)
			} else {
				c.refuse("MANDATE1013", md, code, "example %d: %v", i+1, err)
			}
			continue
		}
		canon, err := canonicalJSON([]byte(ex.GetInput()))
		if err != nil {
			c.refuse("MANDATE1013", md, code, "example %d: %v", i+1, err)
			continue
		}
		out = append(out, manifest.Example{Description: ex.GetDescription(), Input: canon})
	}
	return out
}

func canonicalJSON(b []byte) (json.RawMessage, error) {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	return manifest.Canonical(v, false)
}

func topLevelScalar(md protoreflect.MessageDescriptor, name string) bool {
	fd := md.Fields().ByName(protoreflect.Name(name))
	return fd != nil && !fd.IsList() && !fd.IsMap() && fd.Message() == nil
}

func confirmationRequired(decl *mandatev1.CommandOptions, level int) bool {
	switch decl.GetConfirmation() {
	case mandatev1.Confirmation_CONFIRMATION_REQUIRED:
		return true
	case mandatev1.Confirmation_CONFIRMATION_NEVER, mandatev1.Confirmation_CONFIRMATION_CONDITIONAL:
		return false
	}
	return level >= 3 || (!decl.GetReversible() && len(decl.GetSideEffects()) > 0)
}

func confirmationName(c mandatev1.Confirmation) string {
	switch c {
	case mandatev1.Confirmation_CONFIRMATION_REQUIRED:
		return "REQUIRED"
	case mandatev1.Confirmation_CONFIRMATION_NEVER:
		return manifest.ConfirmationNever
	case mandatev1.Confirmation_CONFIRMATION_CONDITIONAL:
		return manifest.ConfirmationConditional
	}
	return manifest.ConfirmationDefault
}

// conditions checks the declared conditions (MANDATE1019, MANDATE1020,
// MANDATE1021) and returns them as the manifest records them. Each
// expression is compiled against the request message: the build refuses
// one that does not compile or is not a boolean.
func (c *compiler) conditions(md protoreflect.MethodDescriptor, code string, decl *mandatev1.CommandOptions) []manifest.Condition {
	out := []manifest.Condition{}
	asks := false
	seen := map[string]bool{}
	for i, cd := range decl.GetConditions() {
		id := cd.GetId()
		c.checkID("MANDATE1020", md, code, "condition", "large-refund", i, id, seen)
		effect := condition.EffectName(cd.GetEffect())
		if effect == "" {
			c.refuse("MANDATE1020", md, code, "condition %q has no `effect`; declare CONDITION_EFFECT_REQUIRE_CONFIRMATION or CONDITION_EFFECT_DENY", id)
		}
		if effect == condition.EffectRequireConfirmation {
			asks = true
		}
		if strings.TrimSpace(cd.GetDescription()) == "" {
			c.refuse("MANDATE1020", md, code, "condition %q has no `description`; write the sentence a human reads, e.g. \"a human is asked when the amount is above 20.00\"", id)
		}
		if err := c.compileCondition(md.Input(), cd.GetExpression()); err != nil {
			c.refuse("MANDATE1019", md, code, "condition %q does not compile against %s: %s; write a CEL boolean over `request` (the %s) and `principal` (mandate.v1.ConditionPrincipal), e.g. `request.amount.amount_minor > 2000`",
				id, md.Input().FullName(), strings.Join(strings.Fields(err.Error()), " "), md.Input().Name())
		}
		out = append(out, manifest.Condition{
			ID: id, Expression: cd.GetExpression(), Effect: effect, Description: strings.TrimSpace(cd.GetDescription()),
		})
	}
	if decl.GetConfirmation() == mandatev1.Confirmation_CONFIRMATION_CONDITIONAL {
		switch {
		case int(decl.GetRisk())-1 == 4:
			c.refuse("MANDATE1021", md, code, "`confirmation: CONFIRMATION_CONDITIONAL` on an L4 command: every L4 call is approved; remove it")
		case !asks:
			c.refuse("MANDATE1021", md, code, "`confirmation: CONFIRMATION_CONDITIONAL` without a condition of effect CONDITION_EFFECT_REQUIRE_CONFIRMATION: nobody would ever be asked; declare the condition under which a human is asked, or drop the confirmation value")
		}
	}
	return out
}

// limits checks the declared limits (MANDATE1023) and returns them as
// the manifest records them: each needs an id unique among the command's
// limits and conditions, a scope, a window within (0, 31 days], a
// positive ceiling, field paths that resolve on the request (an integer to
// sum, a string or enum to group by), what happens when exhausted and a
// description.
func (c *compiler) limits(md protoreflect.MethodDescriptor, code string, decl *mandatev1.CommandOptions, conds []manifest.Condition) []manifest.Limit {
	var out []manifest.Limit
	seen := map[string]bool{}
	for _, cd := range conds {
		seen[cd.ID] = true
	}
	for i, l := range decl.GetLimits() {
		id := l.GetId()
		c.checkID("MANDATE1023", md, code, "limit", "agent-daily-refunds", i, id, seen)
		per := limit.PerName(l.GetPer())
		if per == "" {
			c.refuse("MANDATE1023", md, code, "limit %q has no `per`; declare LIMIT_SCOPE_AGENT, LIMIT_SCOPE_USER or LIMIT_SCOPE_TENANT", id)
		}
		w := l.GetWindow()
		switch {
		case w == nil:
			c.refuse("MANDATE1023", md, code, "limit %q has no `window`; declare how long a call counts, e.g. `window: {seconds: 3600}`", id)
		case !w.IsValid() || limit.CheckWindow(w.AsDuration()) != nil:
			c.refuse("MANDATE1023", md, code, "limit %q: `window` must be positive and at most 31 days", id)
		}
		if l.GetMax() <= 0 {
			c.refuse("MANDATE1023", md, code, "limit %q: `max` must be positive (the most calls, or the most of `sum_field`, per window)", id)
		}
		if f := l.GetSumField(); f != "" {
			if _, err := limit.Resolve(md.Input(), f, true); err != nil {
				c.refuse("MANDATE1023", md, code, "limit %q: `sum_field` %q does not name a singular integer field of %s (%s); name one by its proto path, e.g. `amount.amount_minor`", id, f, md.Input().FullName(), strings.TrimPrefix(err.Error(), limit.ErrPath.Error()+": "))
			}
		}
		if f := l.GetGroupField(); f != "" {
			if _, err := limit.Resolve(md.Input(), f, false); err != nil {
				c.refuse("MANDATE1023", md, code, "limit %q: `group_field` %q does not name a singular string or enum field of %s (%s); name one by its proto path, e.g. `amount.currency_code`", id, f, md.Input().FullName(), strings.TrimPrefix(err.Error(), limit.ErrPath.Error()+": "))
			}
		}
		then := limit.ExhaustedName(l.GetWhenExhausted())
		if then == "" {
			c.refuse("MANDATE1023", md, code, "limit %q has no `when_exhausted`; declare LIMIT_EXHAUSTED_REFUSE or LIMIT_EXHAUSTED_ESCALATE", id)
		}
		desc := strings.TrimSpace(l.GetDescription())
		if desc == "" {
			c.refuse("MANDATE1023", md, code, "limit %q has no `description`; write the sentence a human reads, e.g. \"an agent refunds at most 500.00 a day per currency\"", id)
		}
		out = append(out, manifest.Limit{
			ID: id, Per: per, Window: limit.WindowString(w), Max: l.GetMax(), SumField: l.GetSumField(),
			GroupField: l.GetGroupField(), WhenExhausted: then, Description: desc,
		})
	}
	return out
}

// checkID checks the id of the i-th declared condition or limit (what):
// present, well formed, and not one seen already among the command's
// conditions and limits, which share ids; rule is the refusal's.
func (c *compiler) checkID(rule string, md protoreflect.MethodDescriptor, code, what, example string, i int, id string, seen map[string]bool) {
	switch {
	case id == "":
		c.refuse(rule, md, code, "%s %d has no `id`; give it a stable kebab-case id such as `%s`", what, i+1, example)
	case len(id) > condition.MaxIDLen || !condition.IDPattern.MatchString(id):
		c.refuse(rule, md, code, "%s id %q is malformed; use lower-case letters and digits in segments joined by '-', '_' or '.', at most %d characters, e.g. `%s`", what, id, condition.MaxIDLen, example)
	case seen[id]:
		c.refuse(rule, md, code, "%s id %q is declared twice (the conditions and limits of a command share ids); give each its own", what, id)
	}
	seen[id] = true
}

// compileCondition type-checks expr against input.
func (c *compiler) compileCondition(input protoreflect.MessageDescriptor, expr string) error {
	if strings.TrimSpace(expr) == "" {
		return errors.New("the expression is empty")
	}
	env, ok := c.envs[input.FullName()]
	if !ok {
		var err error
		if env, err = condition.NewEnv(c.files, input); err != nil {
			return err
		}
		if c.envs == nil {
			c.envs = map[protoreflect.FullName]*condition.Env{}
		}
		c.envs[input.FullName()] = env
	}
	_, err := env.Compile(expr)
	return err
}

func lifecycleName(l mandatev1.Lifecycle) string {
	switch l {
	case mandatev1.Lifecycle_LIFECYCLE_DRAFT:
		return "DRAFT"
	case mandatev1.Lifecycle_LIFECYCLE_DEPRECATED:
		return "DEPRECATED"
	}
	return "PUBLISHED"
}

func approver(a *mandatev1.ApproverPolicy) manifest.Approver {
	if a.GetKind() == mandatev1.ApproverKind_APPROVER_KIND_PERMISSION_HOLDER {
		return manifest.Approver{Kind: "PERMISSION_HOLDER", Permission: a.GetPermission(), Declared: true}
	}
	return manifest.Approver{Kind: "REQUESTING_USER", Declared: a != nil}
}

func rpcOf(md protoreflect.MethodDescriptor) manifest.RPC {
	svc := md.Parent().FullName()
	r := manifest.RPC{
		Service:    string(svc),
		Method:     string(md.Name()),
		FullMethod: "/" + string(svc) + "/" + string(md.Name()),
		InputType:  string(md.Input().FullName()),
		OutputType: string(md.Output().FullName()),
	}
	opts, _ := md.Options().(*descriptorpb.MethodOptions)
	if opts != nil && proto.HasExtension(opts, annotations.E_Http) {
		rule, _ := proto.GetExtension(opts, annotations.E_Http).(*annotations.HttpRule)
		h := &manifest.HTTPRule{Body: rule.GetBody()}
		switch p := rule.GetPattern().(type) {
		case *annotations.HttpRule_Get:
			h.Method, h.Path = "GET", p.Get
		case *annotations.HttpRule_Post:
			h.Method, h.Path = "POST", p.Post
		case *annotations.HttpRule_Put:
			h.Method, h.Path = "PUT", p.Put
		case *annotations.HttpRule_Patch:
			h.Method, h.Path = "PATCH", p.Patch
		case *annotations.HttpRule_Delete:
			h.Method, h.Path = "DELETE", p.Delete
		case *annotations.HttpRule_Custom:
			h.Method, h.Path = p.Custom.GetKind(), p.Custom.GetPath()
		}
		if h.Path != "" {
			r.HTTP = h
		}
	}
	return r
}

func leadingComment(d protoreflect.Descriptor) string {
	loc := d.ParentFile().SourceLocations().ByDescriptor(d)
	return strings.Join(strings.Fields(loc.LeadingComments), " ")
}

func jsonDuration(d time.Duration) string {
	b, _ := protojson.Marshal(durationpb.New(d))
	var s string
	_ = json.Unmarshal(b, &s)
	return s
}

func sortedCopy(v []string) []string {
	out := append([]string{}, v...)
	sort.Strings(out)
	return out
}

func nonNil(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}
