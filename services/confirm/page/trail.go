package page

// The trail page (/approve/audit): the audit trail of the signed-in human's
// tenant, for holders of audit.read (issue 27 §5).
//
// It lives here, beside the approval page, because this is where humans
// sign in: the same one-time link and session cookie (Path=/approve) admit
// the visitor. The rows are not this service's: the page asks the audit
// service's API (Query and Verify) as the signed-in user, so that the audit
// service applies its own rules — an active user holding audit.read, rows
// of that user's tenant only — exactly as it does for `mandate audit query
// --audit-addr` or curl. To do so the page mints, per request, a user token
// of one minute for the session's user and tenant, signed with the secret
// that signs the sign-in links (the dev secret), and relays it in
// x-mandate-on-behalf-of beside the confirm service's own service token,
// as every relaying service does (docs/architecture/identity.md). The token
// never leaves the call to the audit service. See
// docs/architecture/audit-chain.md#the-trail-page.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/trail"
)

// TrailPath is where the trail page is served, under the approval page's
// cookie path.
const TrailPath = Pattern + "audit"

// Trail page parameters.
const (
	// ReadTrailPermission is what a user needs to see the trail page: the
	// audit service's own permission for reading the trail.
	ReadTrailPermission = "audit.read"
	// TrailPageSize is how many rows a page shows unless size asks for
	// fewer or more, up to MaxTrailPageSize.
	TrailPageSize    = 25
	MaxTrailPageSize = 100
	// trailTokenTTL is the lifetime of the user token a request of the page
	// relays to the audit service.
	trailTokenTTL = time.Minute
	// maxQueryBytes bounds the query string the page reads.
	maxQueryBytes = 4 << 10
	// maxMessageRunes is how much of a row's message the page shows.
	maxMessageRunes = 300
)

// trailOutcomes are the outcomes the filter offers, in the order shown
// (contract: every outcome a row can carry).
var trailOutcomes = []string{
	contract.OutcomeExecuted, contract.OutcomeRefused, contract.OutcomeFailed, contract.OutcomeUnknown,
	contract.OutcomePending, contract.OutcomeReplayed, contract.OutcomeAllowed, contract.OutcomeApprovalRequired,
	contract.OutcomeApproved, contract.OutcomeDeclined,
}

// pageTokenRE is the shape of the audit service's page tokens (base64url);
// whether one belongs to the filters is the audit service's to say.
var pageTokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// trailView is what the trail page shows (render.go lays it out).
type trailView struct {
	// Agent, Command, Outcome and Approver are the filters as given, Size
	// the page size asked for ("" for the default).
	Agent, Command, Outcome, Approver, Size string
	// Outcomes are the outcome filter's choices.
	Outcomes []outcomeOption
	Chain    chainView
	Rows     []trailRow
	// Older is the next (older) page's token; empty on the last page.
	Older string
	// Paged is set on every page but the first.
	Paged bool
}

type outcomeOption struct {
	Value    string
	Selected bool
}

// chainView is the tenant's chain as the audit service verified it: OK,
// with Checked rows, or broken at row Seq with Problem (of the row of
// Invocation, Phase).
type chainView struct {
	OK                                       bool
	Checked, Seq, Problem, Invocation, Phase string
}

// trailRow is one audit row as the page shows it; every text neutralised
// (confirm.Neutralise) and escaped when written. Arguments are never shown.
type trailRow struct {
	Seq, Time, Phase, Outcome, Channel, Command, Risk string
	// Who is the user the call was made for; Agent and Model the agent
	// acting for them, if any.
	Who, Agent, Model    string
	Stage, Code, Message string
	Invocation, Subject  string
	// Approved is set when the row records the approval that let the call
	// through: who, with which assurance, on which channel, the trust
	// ceiling (client-attested approvals), when, of which challenge.
	Approved                                   bool
	Approver, Assurance, AssuranceMeaning, Via string
	Ceiling, DecidedAt, Challenge              string
	// Decided is set on a decision row (an attempt to decide a challenge,
	// which the confirm service alone appends): the verdict asked, the
	// decision channel and its assurance, and the invocation the
	// challenge belongs to, from the row's arguments.
	Decided                                                    bool
	Verdict, DecisionChannel, DecisionAssurance, ForInvocation string
}

// assuranceMeanings say what an approval's assurance means.
var assuranceMeanings = map[string]string{
	contract.AssuranceSignedIn:       "the approver signed in on the approval page",
	contract.AssuranceClientAttested: "the user's own MCP client answered; the server cannot see who pressed accept",
	contract.AssuranceAPICredential:  "the approver's own credential called the confirm API",
}

// trailQuery is the page's validated query.
type trailQuery struct {
	agent, command, outcome, approver, page string
	size                                    int
}

// parseTrailQuery validates the query string; problem says what is wrong
// with it, for a 400.
func parseTrailQuery(raw string) (q trailQuery, problem string) {
	if len(raw) > maxQueryBytes {
		return q, "The address is too long."
	}
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return q, "The address's query is malformed."
	}
	for key, vs := range vals {
		var to *string
		switch key {
		case "agent":
			to = &q.agent
		case "command":
			to = &q.command
		case "outcome":
			to = &q.outcome
		case "approver":
			to = &q.approver
		case "page":
			to = &q.page
		case "size":
		default:
			return q, "Unknown parameter " + clip(key) + ": filter by agent, command, outcome or approver."
		}
		if len(vs) > 1 {
			return q, "The parameter " + key + " is given more than once."
		}
		v := strings.TrimSpace(vs[0])
		if len(v) > contract.MaxFieldLen {
			return q, "The " + key + " is longer than " + strconv.Itoa(contract.MaxFieldLen) + " bytes."
		}
		if !utf8.ValidString(v) || strings.ContainsFunc(v, unicode.IsControl) {
			return q, "The " + key + " holds invalid UTF-8 or control characters."
		}
		if key == "size" {
			if v == "" {
				continue
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > MaxTrailPageSize {
				return q, "The size must be a whole number from 1 to " + strconv.Itoa(MaxTrailPageSize) + "."
			}
			q.size = n
			continue
		}
		*to = v
	}
	if q.outcome != "" && !slices.Contains(trailOutcomes, q.outcome) {
		return q, "Unknown outcome " + clip(q.outcome) + ": choose one of " + strings.Join(trailOutcomes, ", ") + "."
	}
	if q.page != "" && !pageTokenRE.MatchString(q.page) {
		return q, "The page token is malformed. Start again from the newest rows."
	}
	return q, ""
}

// clip quotes s, shortened, for a message.
func clip(s string) string {
	if len(s) > 32 {
		s = strings.ToValidUTF8(s[:32], "") + "…"
	}
	s, _ = confirm.Neutralise(s)
	return `"` + s + `"`
}

// mayReadTrail reports whether a user of tenant who signed in at signedIn
// may read the trail: active, not revoked since, and holding audit.read. The
// audit service decides again on every call; this only keeps the page
// from asking for those who may not, and the header from linking them.
func (h *Handler) mayReadTrail(ctx context.Context, tenant, user string, signedIn time.Time) (bool, string, error) {
	res, err := h.cfg.Directory.Resolve(ctx, tenant, user, "")
	if err != nil {
		return false, "", err
	}
	res = res.Admit(signedIn)
	if !res.Active {
		return false, failure.CodeAuthorizationPrincipalInactive, nil
	}
	if !res.HasPermission(ReadTrailPermission) {
		return false, failure.CodeAuthorizationPermissionDenied, nil
	}
	return true, "", nil
}

// trail serves the trail page.
func (h *Handler) trail(w http.ResponseWriter, r *http.Request) {
	s, err := h.session(r)
	if err != nil {
		h.fail(w, r, nil, err, "")
		return
	}
	if s == nil {
		h.signIn(w, r, "")
		return
	}
	if h.cfg.Audit == nil {
		h.message(w, r, s, http.StatusNotFound, "Not found", "This deployment serves no audit trail page.", Pattern)
		return
	}
	ctx := r.Context()
	ok, code, err := h.mayReadTrail(ctx, s.Tenant, s.UserID, s.CreatedAt)
	if err != nil {
		h.fail(w, r, s, confirm.Unavailable("resolve user", err), Pattern)
		return
	}
	if !ok {
		h.cfg.Logger.InfoContext(ctx, "trail page: refused", "tenant", s.Tenant, "user", s.UserID, "code", code)
		if code == failure.CodeAuthorizationPrincipalInactive {
			h.message(w, r, s, http.StatusForbidden, "Your account is not active", "Ask your administrator. ("+code+")", Pattern)
			return
		}
		h.message(w, r, s, http.StatusForbidden, "You cannot read the audit trail",
			"Reading the audit trail needs the permission "+ReadTrailPermission+"; ask your administrator for it. ("+code+")", Pattern)
		return
	}
	q, problem := parseTrailQuery(r.URL.RawQuery)
	if problem != "" {
		h.message(w, r, s, http.StatusBadRequest, "Bad request", problem, TrailPath)
		return
	}
	tok, err := identity.MintDev(h.cfg.LoginSecret, identity.MintRequest{
		Issuer: h.cfg.Issuers[0], Audience: h.cfg.TokenAudience, User: s.UserID, Tenant: s.Tenant, TTL: trailTokenTTL,
	})
	if err != nil {
		h.fail(w, r, s, err, Pattern)
		return
	}
	actx := identity.WithRawToken(ctx, tok)
	size := q.size
	if size == 0 {
		size = TrailPageSize
	}
	req := &mandatev1.QueryRequest{
		AgentId: q.agent, Command: q.command, Approver: q.approver, PageSize: int32(size), PageToken: q.page, //nolint:gosec // at most MaxTrailPageSize
	}
	if q.outcome != "" {
		req.Outcomes = []string{q.outcome}
	}
	page, err := h.cfg.Audit.Query(actx, req)
	if err != nil {
		h.trailFail(w, r, s, err)
		return
	}
	chain, err := h.cfg.Audit.Verify(actx, &mandatev1.VerifyRequest{})
	if err != nil {
		h.trailFail(w, r, s, err)
		return
	}
	v := &trailView{Agent: q.agent, Command: q.command, Outcome: q.outcome, Approver: q.approver,
		Older: page.GetNextPageToken(), Paged: q.page != "", Chain: chainOf(chain)}
	if q.size != 0 {
		v.Size = strconv.Itoa(q.size)
	}
	for _, o := range trailOutcomes {
		v.Outcomes = append(v.Outcomes, outcomeOption{Value: o, Selected: o == q.outcome})
	}
	for _, rec := range page.GetRecords() {
		v.Rows = append(v.Rows, rowOf(rec))
	}
	h.render(w, r, http.StatusOK, h.withSession(pageData{Page: "trail", Title: "Audit trail", T: v}, s))
}

// trailFail shows the audit service's refusal, or that it could not be
// asked.
func (h *Handler) trailFail(w http.ResponseWriter, r *http.Request, s *confirm.Session, err error) {
	ctx := r.Context()
	if errors.Is(err, context.Canceled) {
		return
	}
	st, _ := status.FromError(err)
	fe, ok := failure.FromStatus(st)
	if !ok {
		h.cfg.Logger.ErrorContext(ctx, "trail page: the audit service failed", "error", err)
		h.message(w, r, s, http.StatusBadGateway, "The audit trail cannot be read now",
			"The audit service did not answer; the operator's logs have the details.", TrailPath)
		return
	}
	detail := fe.Message + " (" + fe.Code + ")"
	switch {
	case fe.Code == failure.CodeRequestInvalidPageToken || fe.Code == failure.CodeSchemaInvalid:
		h.message(w, r, s, http.StatusBadRequest, "Bad request", detail, TrailPath)
	case strings.HasPrefix(fe.Code, "authentication."):
		// The audit service does not trust the secret that signs the
		// sign-in links: a deployment's configuration, not the visitor's.
		h.cfg.Logger.WarnContext(ctx, "trail page: the audit service refused the page's user token", "code", fe.Code, "error", fe.Message)
		h.message(w, r, s, http.StatusBadGateway, "The audit service did not accept your sign-in",
			"It must trust the secret that signs the approval page's sign-in links (--dev-secret). "+detail, Pattern)
	case fe.Code == failure.CodeAuthorizationPermissionDenied:
		h.message(w, r, s, http.StatusForbidden, "You cannot read the audit trail", detail, Pattern)
	case fe.Code == failure.CodeAuthorizationPrincipalInactive:
		h.message(w, r, s, http.StatusForbidden, "Your account is not active", detail, Pattern)
	case fe.Code == failure.CodeAuditUnavailable:
		h.message(w, r, s, http.StatusServiceUnavailable, "Try again later", detail, TrailPath)
	default:
		h.cfg.Logger.ErrorContext(ctx, "trail page: the audit service refused", "code", fe.Code, "error", fe.Message)
		h.message(w, r, s, http.StatusBadGateway, "The audit trail cannot be read now", detail, Pattern)
	}
}

func chainOf(v *mandatev1.VerifyResponse) chainView {
	c := chainView{OK: v.GetOk(), Checked: strconv.FormatInt(v.GetChecked(), 10)}
	if b := v.GetBroken(); b != nil && !c.OK {
		c.Seq = strconv.FormatInt(b.GetSeq(), 10)
		c.Problem, c.Invocation, c.Phase = neutral(b.GetProblem()), neutral(b.GetInvocationId()), neutral(b.GetPhase())
	}
	return c
}

// rowOf is rec as the page shows it. Its arguments (with sensitive values
// withheld by the executor before they reached the trail) are left out
// altogether, and so are digests and hashes; of a decision row's, only
// the confirm service's fields are read.
func rowOf(rec *mandatev1.AuditRecord) trailRow {
	row := trailRow{
		Seq: strconv.FormatInt(rec.GetSeq(), 10), Phase: neutral(rec.GetPhase()), Outcome: neutral(rec.GetOutcome()),
		Channel: neutral(rec.GetChannel()), Command: neutral(rec.GetCommand()), Risk: neutral(rec.GetRisk()),
		Who: neutral(rec.GetUserId()), Agent: neutral(rec.GetAgentId()),
		Model: neutral(strings.TrimSpace(rec.GetModel() + " " + rec.GetModelVersion())),
		Stage: neutral(rec.GetStage()), Code: neutral(rec.GetCode()), Message: neutral(shorten(rec.GetMessage(), maxMessageRunes)),
		Invocation: neutral(rec.GetInvocationId()), Subject: neutral(rec.GetSubject()),
	}
	if rec.GetTime() != nil {
		row.Time = stamp(rec.GetTime().AsTime())
	}
	var d trail.Arguments
	if rec.GetPhase() == contract.PhaseDecision && json.Unmarshal([]byte(rec.GetArgumentsJson()), &d) == nil {
		// The confirm service's own account of the attempt, not the
		// caller's arguments: nothing sensitive.
		row.Decided = true
		row.Verdict, row.DecisionChannel = neutral(cmp.Or(d.Verdict, "none")), neutral(d.Channel)
		row.DecisionAssurance, row.ForInvocation = neutral(d.Assurance), neutral(d.InvocationID)
	}
	if a := rec.GetApproval(); a != nil {
		row.Approved = true
		row.Approver, row.Assurance, row.Via = neutral(a.GetApprover()), neutral(a.GetAssurance()), neutral(a.GetChannel())
		row.AssuranceMeaning = assuranceMeanings[a.GetAssurance()]
		row.Ceiling, row.Challenge = neutral(a.GetTrustCeiling()), neutral(a.GetChallengeId())
		if a.GetDecidedAt() != nil {
			row.DecidedAt = stamp(a.GetDecidedAt().AsTime())
		}
	}
	return row
}

// neutral shows control, bidi and invisible characters as markers.
func neutral(s string) string {
	s, _ = confirm.Neutralise(s)
	return s
}

// shorten cuts s to at most n runes, marking the cut.
func shorten(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i := 0
	for k := range s {
		if i == n {
			return s[:k] + "…"
		}
		i++
	}
	return s
}
