package page

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/api"
)

// Pattern is where the page is mounted: server.Handle(page.Pattern, h).
const Pattern = confirm.ApprovalPath

const (
	loginPath  = Pattern + "login"
	logoutPath = Pattern + "logout"
	// CookieName names the session cookie. It cannot use the __Host- prefix,
	// which requires Path=/; the cookie is confined to Path=/approve.
	CookieName = "mandate_approve"
	// DefaultSessionTTL is how long a sign-in lasts when Config leaves it 0.
	DefaultSessionTTL = 8 * time.Hour
	cookiePath        = "/approve"
	maxFormBytes      = 16 << 10
	listLimit         = 50
)

// The response headers every page carries.
const (
	ContentSecurityPolicy = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'"
)

// nextRE is where a sign-in link may lead: a challenge or the trail page.
var nextRE = regexp.MustCompile(`^/approve/(?:[A-Za-z0-9_-]{22}|audit)$`)

// Config wires the page.
type Config struct {
	// Confirm decides and reads challenges. Required.
	Confirm *confirm.Service
	// Sessions keeps sign-in tokens and sessions. Required; the same
	// memory or Postgres store the challenges live in.
	Sessions confirm.SessionStore
	// Directory refuses sign-in to users who are not active. Required.
	Directory directory.Resolver
	// LoginSecret verifies sign-in tokens: the dev secret LoginURL signs
	// with. Required, at least 32 bytes.
	LoginSecret []byte
	// Issuers are the accepted `iss` values of sign-in tokens. Required.
	Issuers []string
	// BaseURL is the page's public origin, e.g. "https://confirm.example".
	// It is the only Origin a POST may come from, and https makes the
	// cookie Secure. Empty: the request's own Host (development only).
	BaseURL string
	// SessionTTL defaults to DefaultSessionTTL.
	SessionTTL time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now replaces time.Now when verifying sign-in tokens (tests).
	Now func() time.Time
	// Audit is the audit service, dialled as the confirm service, which
	// the trail page (TrailPath) asks as the signed-in user (trail.go).
	// Nil: no trail page.
	Audit mandatev1.AuditServiceClient
	// TokenAudience is the `aud` of the user tokens the trail page relays
	// to Audit: one the audit service accepts. Required with Audit.
	TokenAudience string
}

// Handler is the approval page; mount it at Pattern.
type Handler struct {
	cfg    Config
	mux    *http.ServeMux
	origin string
	secure bool
}

// New validates cfg and builds the handler.
func New(cfg Config) (*Handler, error) {
	switch {
	case cfg.Confirm == nil:
		return nil, errors.New("page: Config.Confirm is required")
	case cfg.Sessions == nil:
		return nil, errors.New("page: Config.Sessions is required")
	case cfg.Directory == nil:
		return nil, errors.New("page: Config.Directory is required")
	case len(cfg.LoginSecret) < minSecretBytes:
		return nil, errors.New("page: Config.LoginSecret must be at least 32 bytes")
	case len(cfg.Issuers) == 0 || slices.Contains(cfg.Issuers, ""):
		return nil, errors.New("page: Config.Issuers is required")
	case cfg.Audit != nil && cfg.TokenAudience == "":
		return nil, errors.New("page: Config.TokenAudience is required with Config.Audit")
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux()}
	if cfg.BaseURL != "" {
		u, err := url.Parse(cfg.BaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, errors.New("page: Config.BaseURL must be an absolute http(s) URL")
		}
		h.origin, h.secure = u.Scheme+"://"+u.Host, u.Scheme == "https"
	}
	if h.cfg.SessionTTL <= 0 {
		h.cfg.SessionTTL = DefaultSessionTTL
	}
	if h.cfg.Logger == nil {
		h.cfg.Logger = slog.Default()
	}
	if h.cfg.Now == nil {
		h.cfg.Now = time.Now
	}
	h.cfg.LoginSecret = slices.Clone(cfg.LoginSecret)
	h.mux.HandleFunc("GET "+Pattern+"{$}", h.index)
	h.mux.HandleFunc("GET "+loginPath, h.login)
	h.mux.HandleFunc("POST "+logoutPath, h.logout)
	h.mux.HandleFunc("GET "+TrailPath, h.trail)
	h.mux.HandleFunc("GET "+Pattern+"{challenge}", h.show)
	h.mux.HandleFunc("POST "+Pattern+"{challenge}", h.decide)
	h.mux.HandleFunc(Pattern, func(w http.ResponseWriter, r *http.Request) {
		h.message(w, r, nil, http.StatusNotFound, "Not found", "There is no such page.", "")
	})
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", ContentSecurityPolicy)
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Content-Type-Options", "nosniff")
	h.mux.ServeHTTP(w, r)
}

// pageData is what a page shows (render.go lays it out). Back and Refresh
// are paths under Pattern (see pagePath).
type pageData struct {
	Page, Title        string
	User, Tenant, CSRF string
	Detail, Back       string
	Refresh            string
	C                  *challengeView
	// List is the index's requests the visitor may decide; Others are
	// those the visitor asked for that wait for another approver.
	List, Others []listItem
	// TrailLink puts a link to the trail page in the header: the visitor
	// may read the trail.
	TrailLink bool
	// T is the trail page's content.
	T *trailView
}

type challengeView struct {
	ID, State, Title, Summary, Risk, RequestedBy string
	SideEffects, Permissions, Withheld           []string
	// Effects are what the call would do, as its backend previewed it.
	Effects []string
	// Reasons say why a human is asked, where declared conditions ask.
	Reasons                     []string
	Reversible                  bool
	Recall, Arguments, Approver string
	// Fields are the arguments read by their declaration; Writer names who
	// wrote their free text ("the agent support-bot", "alice").
	Fields                        []confirm.PromptField
	Writer, NeutralisedNote       string
	CreatedAt, ExpiresAt          string
	DecidedBy, DecidedAt, Channel string
	Pending, CanDecide            bool
	CannotDecide                  string
	// Hint is what the call does in the approver's words (the
	// declaration's approver_hint); empty without one.
	Hint string
	// ExpiresIn is how long is left to decide ("in 9 min"); Asker is who
	// asks, as the approver reads it ("finance-bot, an agent acting for
	// carol").
	ExpiresIn, Asker string
	// RiskMeaning says what the declared risk level means.
	RiskMeaning string
	// Next says what follows the decision, or followed it.
	Next string
}

// riskMeanings are the declared risk levels as an approver reads them
// (mandate.v1.Risk).
var riskMeanings = map[string]string{
	"L0": "reads only; changes nothing",
	"L1": "a small change that is easy to undo",
	"L2": "a business change with limited, recoverable impact",
	"L3": "moves money, is visible to customers, or is hard to undo",
	"L4": "irreversible and high impact",
}

// exampleClause is an "e.g. …" clause of a field's description: written
// for the agent that fills the field in, it reads to an approver as if it
// were the value (an "e.g. T-1001" beside the real T-1001).
var exampleClause = regexp.MustCompile(`\s*[,;(]?\s*\b(e\.g\.|for example)\s[^;)]*\)?`)

// approverFields are fields with their descriptions worded for an
// approver: no code markup (backticks), no examples meant for the agent.
func approverFields(fs []confirm.PromptField) []confirm.PromptField {
	out := make([]confirm.PromptField, len(fs))
	for i, f := range fs {
		d := strings.ReplaceAll(f.Description, "`", "")
		if cut := exampleClause.ReplaceAllString(d, ""); cut != d {
			d = strings.TrimRight(strings.TrimSpace(cut), ",;:")
			if d != "" && !strings.HasSuffix(d, ".") {
				d += "."
			}
		}
		f.Description = d
		out[i] = f
	}
	return out
}

// Money are the fields that are amounts of money, which the decision
// screen shows first.
func (v *challengeView) Money() []confirm.PromptField {
	var out []confirm.PromptField
	for _, f := range v.Fields {
		if f.Kind == confirm.KindMoney && f.Problem == "" {
			out = append(out, f)
		}
	}
	return out
}

// listItem is one waiting request on the index: Amount is the amounts of
// money among its arguments ("25.00 EUR"), empty when there are none;
// ExpiresIn is relative ("in 9 min"), ExpiresAt the instant.
type listItem struct{ ID, Title, RequestedBy, Amount, Risk, ExpiresIn, ExpiresAt string }

func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, d pageData) {
	if d.User != "" && h.cfg.Audit != nil && !d.TrailLink {
		// The link is a convenience; the trail page checks again, with the
		// session's sign-in time.
		d.TrailLink, _, _ = h.mayReadTrail(r.Context(), d.Tenant, d.User, h.cfg.Now())
	}
	var page htmlWriter
	writePage(&page, &d)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `MandateSignInLink realm="approval page"`)
	}
	w.WriteHeader(status)
	_, _ = w.Write(page.buf.Bytes())
}

func (h *Handler) withSession(d pageData, s *confirm.Session) pageData {
	if s != nil {
		d.User, d.Tenant, d.CSRF = s.UserID, s.Tenant, s.CSRFToken
	}
	return d
}

// signIn is the page every visitor without a session gets: never a prompt.
func (h *Handler) signIn(w http.ResponseWriter, r *http.Request, detail string) {
	h.render(w, r, http.StatusUnauthorized, pageData{Page: "signin", Title: "Sign in", Detail: detail})
}

func (h *Handler) message(w http.ResponseWriter, r *http.Request, s *confirm.Session, status int, title, detail, back string) {
	h.render(w, r, status, h.withSession(pageData{Page: "message", Title: title, Detail: detail, Back: back}, s))
}

// fail renders a refusal of the confirm service with the status its code
// maps to (the same mapping as the API), or a generic error.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, s *confirm.Session, err error, back string) {
	if fe, ok := api.Failure(err); ok {
		status := failure.HTTPStatus(failure.GRPCCode(fe.Code))
		title := map[string]string{
			failure.CodeConfirmationNotFound:           "Not found",
			failure.CodeConfirmationApproverNotAllowed: "You cannot decide this request",
			failure.CodeConfirmationAlreadyDecided:     "Already decided",
			failure.CodeConfirmationExpired:            "Expired",
			failure.CodeAuthorizationPrincipalInactive: "Your account is not active",
			failure.CodeConfirmationUnavailable:        "Try again later",
		}[fe.Code]
		if title == "" {
			title = "Refused"
		}
		if fe.Code == failure.CodeConfirmationUnavailable {
			h.cfg.Logger.WarnContext(r.Context(), "approval page: store unavailable", "error", err)
		}
		h.message(w, r, s, status, title, fe.Message+" ("+fe.Code+")", back)
		return
	}
	if errors.Is(err, context.Canceled) {
		return
	}
	h.cfg.Logger.ErrorContext(r.Context(), "approval page failed", "error", err)
	h.message(w, r, s, http.StatusInternalServerError, "Something went wrong", "The operator's logs have the details.", back)
}

func hashID(v string) string {
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:])
}

func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// session returns the visitor's session, or nil without one.
func (h *Handler) session(r *http.Request) (*confirm.Session, error) {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" || len(c.Value) > 128 {
		return nil, nil
	}
	s, err := h.cfg.Sessions.Session(r.Context(), hashID(c.Value))
	if errors.Is(err, confirm.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &s, nil
}

func actor(s *confirm.Session) identity.Principal {
	return identity.Principal{Kind: identity.KindUser, Tenant: s.Tenant, UserID: s.UserID}
}

func (h *Handler) index(w http.ResponseWriter, r *http.Request) {
	s, err := h.session(r)
	if err != nil {
		h.fail(w, r, nil, err, "")
		return
	}
	if s == nil {
		h.signIn(w, r, "")
		return
	}
	p := actor(s)
	inbox, err := h.cfg.Confirm.Inbox(r.Context(), p, listLimit)
	if err != nil {
		h.fail(w, r, s, err, "")
		return
	}
	visible, err := h.cfg.Confirm.Pending(r.Context(), p, listLimit)
	if err != nil {
		h.fail(w, r, s, err, "")
		return
	}
	d := h.withSession(pageData{Page: "index", Title: "Waiting for you"}, s)
	now := h.cfg.Now()
	mine := map[string]bool{}
	for i := range inbox {
		mine[inbox[i].ID] = true
		d.List = append(d.List, h.item(&inbox[i], now))
	}
	for i := range visible {
		if !mine[visible[i].ID] {
			d.Others = append(d.Others, h.item(&visible[i], now))
		}
	}
	h.render(w, r, http.StatusOK, d)
}

func (h *Handler) item(c *confirm.Challenge, now time.Time) listItem {
	return listItem{
		ID: c.ID, Title: c.Prompt.Title, RequestedBy: c.Prompt.RequestedBy, Risk: c.Prompt.Risk,
		Amount:    strings.Join(h.cfg.Confirm.Amounts(c), ", "),
		ExpiresIn: expiresIn(c.ExpiresAt.Sub(now)), ExpiresAt: stamp(c.ExpiresAt),
	}
}

// expiresIn says how long is left, to the minute: "in 9 min", "in 2 h 5
// min", "in less than a minute"; "now" once nothing is left.
func expiresIn(d time.Duration) string {
	switch {
	case d <= 0:
		return "now"
	case d < time.Minute:
		return "in less than a minute"
	}
	m := int(d / time.Minute)
	if m < 60 {
		return fmt.Sprintf("in %d min", m)
	}
	if m%60 == 0 {
		return fmt.Sprintf("in %d h", m/60)
	}
	return fmt.Sprintf("in %d h %d min", m/60, m%60)
}

// login exchanges a one-time sign-in token for a session.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	claims, err := verifyLogin(r.URL.Query().Get("t"), h.cfg.LoginSecret, h.cfg.Issuers, h.cfg.Now())
	if err != nil {
		h.cfg.Logger.InfoContext(r.Context(), "approval page: sign-in refused", "reason", err.Error())
		h.signIn(w, r, "This sign-in link is not valid or has expired. Ask for a new one.")
		return
	}
	ctx := r.Context()
	if err := h.cfg.Sessions.ConsumeLoginToken(ctx, claims.ID, claims.Expiry.Time()); err != nil {
		if errors.Is(err, confirm.ErrLoginTokenUsed) {
			h.cfg.Logger.WarnContext(ctx, "approval page: a sign-in link was used twice", "tenant", claims.Tenant, "user", claims.User)
			h.signIn(w, r, "This sign-in link was already used. Each link works once; ask for a new one.")
			return
		}
		h.fail(w, r, nil, err, "")
		return
	}
	res, err := h.cfg.Directory.Resolve(ctx, claims.Tenant, claims.User, "")
	if err != nil {
		h.fail(w, r, nil, confirm.Unavailable("resolve user", err), "")
		return
	}
	if !res.Active {
		h.cfg.Logger.InfoContext(ctx, "approval page: sign-in of an inactive user refused", "tenant", claims.Tenant, "user", claims.User, "reason", res.Reason)
		h.message(w, r, nil, http.StatusForbidden, "Your account is not active", "Ask your administrator.", "")
		return
	}
	if old, err := r.Cookie(CookieName); err == nil && old.Value != "" {
		_ = h.cfg.Sessions.DeleteSession(ctx, hashID(old.Value)) // a new sign-in never reuses a session id
	}
	id := randomToken()
	s, err := h.cfg.Sessions.CreateSession(ctx, confirm.Session{
		IDHash: hashID(id), Tenant: claims.Tenant, UserID: claims.User, CSRFToken: randomToken(),
	}, h.cfg.SessionTTL)
	if err != nil {
		h.fail(w, r, nil, err, "")
		return
	}
	//nolint:gosec // G124: Secure is set whenever the page is served over https (BaseURL or TLS); dev runs plain http on loopback.
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: id, Path: cookiePath, MaxAge: int(h.cfg.SessionTTL.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: h.secure || r.TLS != nil,
	})
	h.cfg.Logger.InfoContext(ctx, "approval page: signed in", "tenant", s.Tenant, "user", s.UserID)
	next := r.URL.Query().Get("next")
	if !nextRE.MatchString(next) {
		next = Pattern
	}
	// A page of our own (not a redirect) moves on, so that the next request
	// is same-site and carries the SameSite=Strict cookie even when the link
	// was opened from another site.
	d := h.withSession(pageData{Page: "message", Title: "Signed in", Detail: "You are signed in as " + s.UserID + ".", Back: next, Refresh: next}, &s)
	h.render(w, r, http.StatusOK, d)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	s, err := h.session(r)
	if err != nil {
		h.fail(w, r, nil, err, "")
		return
	}
	if s == nil {
		h.signIn(w, r, "")
		return
	}
	if !h.checkForm(w, r, s) {
		return
	}
	if err := h.cfg.Sessions.DeleteSession(r.Context(), s.IDHash); err != nil {
		h.fail(w, r, s, err, "")
		return
	}
	//nolint:gosec // G124: as in login; this cookie only expires the session cookie.
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: cookiePath, MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: h.secure || r.TLS != nil})
	h.message(w, r, nil, http.StatusOK, "Signed out", "Open a new sign-in link to come back.", "")
}

func (h *Handler) show(w http.ResponseWriter, r *http.Request) {
	s, err := h.session(r)
	if err != nil {
		h.fail(w, r, nil, err, "")
		return
	}
	if s == nil {
		h.signIn(w, r, "")
		return
	}
	p := actor(s)
	c, err := h.cfg.Confirm.Get(r.Context(), p, r.PathValue("challenge"))
	if err != nil {
		h.fail(w, r, s, err, Pattern)
		return
	}
	v := view(&c)
	v.Fields = approverFields(h.cfg.Confirm.Fields(&c))
	v.ExpiresIn = expiresIn(c.ExpiresAt.Sub(h.cfg.Now()))
	if v.Pending {
		if err := h.cfg.Confirm.CanDecide(r.Context(), p, c); err != nil {
			if fe, ok := api.Failure(err); ok {
				v.CannotDecide = "You cannot decide this request: " + fe.Message + "."
			} else {
				h.fail(w, r, s, err, Pattern)
				return
			}
		} else {
			v.CanDecide = true
		}
	}
	h.render(w, r, http.StatusOK, h.withSession(pageData{Page: "challenge", Title: c.Prompt.Title, C: v}, s))
}

// decide records the signed-in human's decision, then shows the result
// (POST-redirect-GET).
func (h *Handler) decide(w http.ResponseWriter, r *http.Request) {
	s, err := h.session(r)
	if err != nil {
		h.fail(w, r, nil, err, "")
		return
	}
	if s == nil {
		h.signIn(w, r, "")
		return
	}
	if !h.checkForm(w, r, s) {
		return
	}
	id := r.PathValue("challenge")
	var approve bool
	switch r.PostForm.Get("decision") {
	case "approve":
		approve = true
	case "decline":
	default:
		h.message(w, r, s, http.StatusBadRequest, "Unknown decision", "Use the Approve or Decline button.", Pattern+id)
		return
	}
	c, err := h.cfg.Confirm.Decide(r.Context(), actor(s), id, approve, confirm.ChannelApprovalPage)
	if err != nil {
		h.fail(w, r, s, err, Pattern+id)
		return
	}
	// The stored challenge's id (validated, URL-safe), never request text.
	http.Redirect(w, r, Pattern+c.ID, http.StatusSeeOther) //nolint:gosec // G710: a path on this page built from a stored id

}

// checkForm guards a state-changing POST: it must come from this page
// (Sec-Fetch-Site same-origin and Origin our own, when the browser sends
// them) and carry the session's CSRF token. It answers 403 itself and
// returns false otherwise.
func (h *Handler) checkForm(w http.ResponseWriter, r *http.Request, s *confirm.Session) bool {
	forbid := func(why string) bool {
		h.cfg.Logger.WarnContext(r.Context(), "approval page: forged or stale form refused", "reason", why, "tenant", s.Tenant, "user", s.UserID)
		h.message(w, r, s, http.StatusForbidden, "Refused",
			"This form did not come from this page or has expired. Reload the page and try again.", r.URL.Path)
		return false
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return forbid("Sec-Fetch-Site " + site)
	}
	// With Referrer-Policy no-referrer, browsers send "Origin: null" even for
	// a form of our own; such a request stands on Sec-Fetch-Site and the CSRF
	// token.
	if origin := r.Header.Get("Origin"); origin != "" && origin != "null" && !strings.EqualFold(origin, h.expectedOrigin(r)) {
		return forbid("foreign Origin")
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		return forbid("unreadable form")
	}
	token := r.PostForm.Get("csrf")
	if token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(s.CSRFToken)) != 1 {
		return forbid("missing or wrong CSRF token")
	}
	return true
}

func (h *Handler) expectedOrigin(r *http.Request) string {
	if h.origin != "" {
		return h.origin
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

func view(c *confirm.Challenge) *challengeView {
	v := &challengeView{
		ID: c.ID, State: string(c.State), Title: c.Prompt.Title, Summary: c.Prompt.Summary, Risk: c.Prompt.Risk,
		RequestedBy: c.Prompt.RequestedBy, SideEffects: c.Prompt.SideEffects, Permissions: c.Prompt.Permissions,
		Withheld: c.Prompt.WithheldFields, Reversible: c.Prompt.Reversible, Recall: c.Prompt.Recall, Effects: c.Prompt.Effects,
		Reasons: c.Prompt.Reasons, Hint: c.Prompt.Hint,
		Arguments: prettyJSON(c.Prompt.ArgumentsJSON), CreatedAt: stamp(c.CreatedAt), ExpiresAt: stamp(c.ExpiresAt),
		DecidedBy: c.DecidedBy, Channel: c.DecisionChannel, Pending: c.State == confirm.StatePending,
		NeutralisedNote: confirm.NeutralisedNote,
	}
	if c.Decided() {
		v.DecidedAt = stamp(c.DecidedAt)
	}
	if c.RequesterAgent != "" {
		v.Writer, _ = confirm.Neutralise("the agent " + c.RequesterAgent)
		v.Asker, _ = confirm.Neutralise(c.RequesterAgent + ", an agent acting for " + c.RequesterUser)
	} else {
		v.Writer, _ = confirm.Neutralise(c.RequesterUser)
		v.Asker = v.Writer
	}
	v.RiskMeaning = riskMeanings[c.Prompt.Risk]
	by := v.Asker
	switch c.State {
	case confirm.StatePending:
		v.Next = "Approve lets this exact call run once, if " + by + " sends it again before the request expires; nothing has run yet. Decline means it will not run, and " + by + " is told so."
	case confirm.StateApproved:
		v.Next = "Approved. Nothing has run yet: the call runs once, when " + by + " sends it again with this approval before it expires. The audit trail will name you as the approver."
	case confirm.StateRedeemed:
		v.Next = "Approved and used: the call was sent with this approval. Its outcome is in the audit trail."
	case confirm.StateDeclined:
		v.Next = "Declined. The call will not run; " + by + " is told it was declined."
	case confirm.StateExpired:
		v.Next = "Nobody decided in time, so the call did not run. " + by + " has to ask again."
	}
	switch c.Approver.Kind {
	case confirm.ApproverPermissionHolder:
		v.Approver = "another user holding " + c.Approver.Permission + " (not " + c.RequesterUser + ")"
	default:
		v.Approver = c.RequesterUser + ", for whom the call is made"
	}
	return v
}

// prettyJSON indents the arguments, with control, bidi and invisible
// characters as \u escapes (a prompt that came from an older renderer may
// still hold them raw).
func prettyJSON(s string) string {
	s = confirm.EscapeInvisibleJSON(s)
	var buf bytes.Buffer
	if err := json.Indent(&buf, []byte(s), "", "  "); err != nil {
		text, _ := confirm.Neutralise(s)
		return text
	}
	return buf.String()
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }
