package confirm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// Commands looks up command declarations; *manifest.Set implements it.
type Commands interface {
	ByCode(code string) (*manifest.Command, bool)
	// DeclarationDigest is the digest of a command's declaration: an
	// approval holds for the declaration it was given under.
	DeclarationDigest(code string) string
}

// Config wires a Service.
type Config struct {
	// Store keeps the challenges. Required.
	Store Store
	// Directory says whether a principal is active and what it holds.
	// Required; a *directory.Cache in production.
	Directory directory.Resolver
	// Commands holds the declarations challenges are opened for. Required.
	Commands Commands
	// ApprovalBaseURL is the public origin of the approval page, e.g.
	// "https://confirm.example.com"; a challenge's approval URL is
	// ApprovalBaseURL + ApprovalPath + id. Empty: no approval URL.
	ApprovalBaseURL string
	// MaxOpenPerRequester bounds the challenges one requester (a user, or
	// an agent acting for one) holds pending at once, so that an agent
	// cannot flood its approvers (default DefaultMaxOpenPerRequester). An
	// Open past it is refused with confirmation.too_many_open until some
	// are decided or expire. Concurrent Opens may pass it by a few.
	MaxOpenPerRequester int
	// Trail records every attempt to decide a challenge, accepted or
	// refused (audit phase decision). Nil records none.
	Trail Trail
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// DefaultMaxOpenPerRequester is how many challenges one requester may hold
// pending at once unless Config says otherwise.
const DefaultMaxOpenPerRequester = 20

// Service applies the confirmation rules on top of a Store. Every method
// takes the verified caller (identity.Principal, from the transport's
// authentication) and refuses with an *Error whose code says why. It is
// safe for concurrent use.
type Service struct {
	maxOpen  int
	store    Store
	dir      directory.Resolver
	commands Commands
	baseURL  string
	trail    Trail
	log      *slog.Logger
}

// New validates cfg.
func New(cfg Config) (*Service, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("confirm: Config.Store is required")
	case cfg.Directory == nil:
		return nil, errors.New("confirm: Config.Directory is required")
	case cfg.Commands == nil:
		return nil, errors.New("confirm: Config.Commands is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxOpenPerRequester < 0 {
		return nil, errors.New("confirm: Config.MaxOpenPerRequester must not be negative")
	}
	if cfg.MaxOpenPerRequester == 0 {
		cfg.MaxOpenPerRequester = DefaultMaxOpenPerRequester
	}
	return &Service{
		maxOpen: cfg.MaxOpenPerRequester,
		store:   cfg.Store, dir: cfg.Directory, commands: cfg.Commands,
		baseURL: strings.TrimRight(cfg.ApprovalBaseURL, "/"), trail: cfg.Trail, log: cfg.Logger,
	}, nil
}

// ApprovalURL is the approval page of challenge id, or "" without a base
// URL.
func (s *Service) ApprovalURL(id string) string {
	if s.baseURL == "" {
		return ""
	}
	return s.baseURL + ApprovalPath + id
}

// OpenRequest opens a challenge for one invocation.
type OpenRequest struct {
	// Command is the command's code.
	Command string
	// InvocationDigest is the executor's digest of the invocation.
	InvocationDigest string
	// InvocationID names the invocation.
	InvocationID string
	// ArgumentsJSON is the request with sensitive values withheld.
	ArgumentsJSON string
	// WithheldFields are the JSON pointers of the withheld values.
	WithheldFields []string
	// Effects are the lines of the command's backend's preview of the call
	// (what it would do), shown to the approver; PreviewDigest is the
	// executor's digest of that preview, required with them.
	Effects       []string
	PreviewDigest string
	// Conditions are the ids of the command's declared conditions that ask
	// for this confirmation; their descriptions are the prompt's reasons.
	Conditions []string
	// TTL is how long the challenge stays open: 0 means DefaultTTL; more
	// than MaxTTL is refused.
	TTL time.Duration
}

// Open opens a challenge for the invocation that p — the requester, relayed
// by a Mandate service — is making. Tenant, user and agent come from p,
// never from the request. The approver policy and the prompt come from the
// command's declaration. Opening again for the same invocation returns the
// first challenge.
func (s *Service) Open(ctx context.Context, p identity.Principal, req OpenRequest) (Challenge, error) {
	if err := relayed(p, "open a challenge"); err != nil {
		return Challenge{}, err
	}
	if err := validateOpen(&req); err != nil {
		return Challenge{}, err
	}
	res, err := s.resolve(ctx, p)
	if err != nil {
		return Challenge{}, err
	}
	cmd, ok := s.commands.ByCode(req.Command)
	if !ok || !cmd.Published() {
		return Challenge{}, refuse(ErrCommandNotFound, "no published command "+req.Command)
	}
	for _, perm := range cmd.Permissions {
		// The pipeline checks permissions before asking anyone; checking
		// again here keeps an approval from ever standing in for one.
		if !res.HasPermission(perm) {
			return Challenge{}, refuse(ErrPermissionDenied, "the requester lacks "+perm+", which "+cmd.Code+" needs")
		}
	}
	policy, err := policyOf(cmd)
	if err != nil {
		return Challenge{}, err
	}
	open, err := s.store.CountPending(ctx, p.Tenant, p.UserID, p.AgentID)
	if err != nil {
		return Challenge{}, err
	}
	if open >= s.maxOpen {
		s.log.WarnContext(ctx, "challenge refused: too many open", "tenant", p.Tenant, "user", p.UserID, "agent", p.AgentID,
			"open", open, "invocation_id", req.InvocationID)
		return Challenge{}, refuse(ErrTooManyOpen, fmt.Sprintf("%d approvals requested by this caller are still waiting (at most %d); wait until some are decided or expire", open, s.maxOpen))
	}
	prompt, err := RenderPrompt(cmd, PromptInput{
		ArgumentsJSON: req.ArgumentsJSON, WithheldFields: req.WithheldFields,
		RequesterUser: p.UserID, RequesterAgent: p.AgentID,
		Effects: req.Effects, PreviewDigest: req.PreviewDigest, Conditions: req.Conditions,
	})
	if err != nil {
		return Challenge{}, err
	}
	prompt.DeclarationDigest = s.commands.DeclarationDigest(cmd.Code)
	c := Challenge{
		ID: NewID(), Tenant: p.Tenant, Command: cmd.Code, Risk: cmd.Risk,
		InvocationDigest: req.InvocationDigest, InvocationID: req.InvocationID,
		RequesterUser: p.UserID, RequesterAgent: p.AgentID,
		Approver: policy, Prompt: prompt,
	}
	stored, created, err := s.store.Create(ctx, c, req.TTL)
	if err != nil {
		return Challenge{}, err
	}
	if !created && (stored.InvocationDigest != c.InvocationDigest || stored.Command != c.Command ||
		stored.RequesterUser != c.RequesterUser || stored.RequesterAgent != c.RequesterAgent) {
		return Challenge{}, refuse(ErrGrantMismatch, "invocation "+req.InvocationID+" already has a challenge for another request")
	}
	return stored, nil
}

func validateOpen(req *OpenRequest) error {
	switch {
	case req.Command == "" || len(req.Command) > 128:
		return Invalid("command", "must be 1 to 128 characters")
	case !ValidDigest(req.InvocationDigest):
		return Invalid("invocation_digest", "must be 64 lower-case hex characters")
	case req.InvocationID == "" || len(req.InvocationID) > 128:
		return Invalid("invocation_id", "must be 1 to 128 characters")
	case req.TTL < 0:
		return Invalid("ttl", "must not be negative")
	case req.TTL > MaxTTL:
		return Invalid("ttl", "must be at most "+MaxTTL.String())
	}
	if req.TTL == 0 {
		req.TTL = DefaultTTL
	}
	return nil
}

// policyOf turns the declaration's approver into a policy. L4 commands
// always record an approver, so an L4 command must declare who that is.
func policyOf(cmd *manifest.Command) (ApproverPolicy, error) {
	if manifest.RiskLevel(cmd.Risk) == 4 && !cmd.Approver.Declared {
		return ApproverPolicy{}, refuse(ErrApproverNotAllowed, cmd.Code+" is L4 and declares no approver policy; nobody may approve it")
	}
	switch kind := ApproverKind(cmd.Approver.Kind); kind {
	case ApproverRequestingUser, "":
		return ApproverPolicy{Kind: ApproverRequestingUser}, nil
	case ApproverPermissionHolder:
		if cmd.Approver.Permission == "" {
			return ApproverPolicy{}, refuse(ErrApproverNotAllowed, cmd.Code+" names no permission for its approver; nobody may approve it")
		}
		return ApproverPolicy{Kind: kind, Permission: cmd.Approver.Permission}, nil
	default:
		return ApproverPolicy{}, refuse(ErrApproverNotAllowed, cmd.Code+" declares an unknown approver kind; nobody may approve it")
	}
}

// Get returns a challenge to its requester (the user, its agents, or a
// service relaying either) or to a human who may decide it. Anyone else —
// another tenant included — gets ErrNotFound.
func (s *Service) Get(ctx context.Context, p identity.Principal, id string) (Challenge, error) {
	c, res, err := s.visible(ctx, p, id)
	if err == nil {
		c.Elicitable = elicitable(p, res, &c) == nil
	}
	return c, err
}

// Await streams a challenge visible to p (as Get) until it is decided or
// expires; see Store.Watch.
func (s *Service) Await(ctx context.Context, p identity.Principal, id string) (<-chan Challenge, error) {
	if _, _, err := s.visible(ctx, p, id); err != nil {
		return nil, err
	}
	return s.store.Watch(ctx, p.Tenant, id)
}

// Decide records a human's answer. Agents never decide, whatever user their
// token names; the approver policy says which human may. channel is where
// the decision was made ("" means ChannelAPI). A user of another tenant
// gets ErrNotFound; a user of the tenant the policy does not name gets
// ErrApproverNotAllowed. Every call, accepted or refused, is an attempt
// the trail records (Config.Trail).
func (s *Service) Decide(ctx context.Context, p identity.Principal, id string, approve bool, channel string) (Challenge, error) {
	var read *Challenge
	c, err := s.decide(ctx, p, id, approve, channel, &read)
	if channel == "" {
		channel = ChannelAPI
	}
	s.recordAttempt(ctx, p, id, verdict(approve), channel, read, err)
	return c, err
}

// decide is Decide; it sets *read to the challenge once it has read it.
func (s *Service) decide(ctx context.Context, p identity.Principal, id string, approve bool, channel string, read **Challenge) (Challenge, error) {
	if p.Kind == identity.KindAgent || p.AgentID != "" {
		return Challenge{}, refuse(ErrApproverNotAllowed, "agents never approve or decline; a human must")
	}
	if p.Kind != identity.KindUser {
		return Challenge{}, refuse(ErrApproverNotAllowed, "only a signed-in human decides")
	}
	if channel == "" {
		channel = ChannelAPI
	}
	if !ValidChannel(channel) {
		return Challenge{}, Invalid("channel", "must be approval_page, mcp_elicitation or api")
	}
	res, err := s.resolve(ctx, p)
	if err != nil {
		return Challenge{}, err
	}
	if !ValidID(id) {
		return Challenge{}, ErrNotFound
	}
	c, err := s.store.Get(ctx, p.Tenant, id)
	if err != nil {
		return Challenge{}, err
	}
	*read = &c
	if err := mayDecide(p, res, &c); err != nil {
		return Challenge{}, err
	}
	if approve && channel != ChannelApprovalPage && manifest.RiskLevel(c.Risk) == 4 {
		return Challenge{}, refuse(ErrApproverNotAllowed, c.Command+" is L4: it is approved only on the approval page, by a human signed in there")
	}
	decided, err := s.store.Decide(ctx, p.Tenant, id, Decision{Approve: approve, By: p.UserID, Channel: channel})
	if err != nil {
		return Challenge{}, err
	}
	*read = &decided
	s.log.InfoContext(ctx, "challenge decided", "tenant", p.Tenant, "challenge_id", id,
		"invocation_id", decided.InvocationID, "command", decided.Command, "state", string(decided.State),
		"decided_by", p.UserID, "channel", channel)
	return decided, nil
}

// DecideElicited records the answer that the human behind an MCP session
// gave, through elicitation, to a challenge of that session's own call. p is
// the session's principal: a user, or an agent acting for one; the decision
// is recorded as p's user through ChannelMCPElicitation. The server cannot
// tell a human's answer from the agent runtime's code, so the answer counts
// only where the directory says p's client is operated by its user (a user
// acting directly, or an agent with host interactive); a headless agent's
// user confirms on the approval page, signed in. Only a challenge p itself
// requested (same user and agent) may be answered this way, and only where
// the requesting user is the approver the declaration names (see
// CheckElicitable): four-eyes policies and L4 commands need a second human
// on the approval page. Transports accept the call only from the MCP bridge
// (confirm/api checks the relay). Every call is an attempt the trail
// records, as Decide's.
func (s *Service) DecideElicited(ctx context.Context, p identity.Principal, id string, approve bool) (Challenge, error) {
	var read *Challenge
	c, err := s.decideElicited(ctx, p, id, approve, &read)
	s.recordAttempt(ctx, p, id, verdict(approve), ChannelMCPElicitation, read, err)
	return c, err
}

// decideElicited is DecideElicited; it sets *read as decide does.
func (s *Service) decideElicited(ctx context.Context, p identity.Principal, id string, approve bool, read **Challenge) (Challenge, error) {
	if (p.Kind != identity.KindUser && p.Kind != identity.KindAgent) || p.Tenant == "" || p.UserID == "" {
		return Challenge{}, refuse(ErrApproverNotAllowed, "an elicited answer is recorded for the session's user; a user's or an agent's principal is needed")
	}
	res, err := s.resolve(ctx, p)
	if err != nil {
		return Challenge{}, err
	}
	if !ValidID(id) {
		return Challenge{}, ErrNotFound
	}
	c, err := s.store.Get(ctx, p.Tenant, id)
	if err != nil {
		return Challenge{}, err
	}
	*read = &c
	if err := elicitable(p, res, &c); err != nil {
		return Challenge{}, err
	}
	decided, err := s.store.Decide(ctx, p.Tenant, id, Decision{Approve: approve, By: p.UserID, Channel: ChannelMCPElicitation})
	if err != nil {
		return Challenge{}, err
	}
	*read = &decided
	s.log.InfoContext(ctx, "challenge decided", "tenant", p.Tenant, "challenge_id", id,
		"invocation_id", decided.InvocationID, "command", decided.Command, "state", string(decided.State),
		"decided_by", p.UserID, "agent", p.AgentID, "channel", ChannelMCPElicitation)
	return decided, nil
}

// CheckElicitable reports (nil) whether the requester's own human may
// decide c through MCP elicitation: the approver policy must name the
// requesting user, and the command must be below L4 (an L4 call always
// records a second human, on the approval page). Otherwise it returns
// ErrApproverNotAllowed saying who must decide. The MCP bridge asks it
// before it puts a form to the client's user.
func CheckElicitable(c *Challenge) error {
	risk := c.Risk
	if risk == "" {
		risk = c.Prompt.Risk
	}
	switch {
	case manifest.RiskLevel(risk) == 4:
		return refuse(ErrApproverNotAllowed, c.Command+" is L4: a second human must approve it on the approval page, not the requester through elicitation")
	case c.Approver.Kind == ApproverPermissionHolder:
		return refuse(ErrApproverNotAllowed, "four eyes: another user holding "+c.Approver.Permission+" must approve "+c.Command+" on the approval page")
	case c.Approver.Kind != ApproverRequestingUser:
		return refuse(ErrApproverNotAllowed, "the challenge has no approver policy that elicitation can satisfy")
	}
	return nil
}

// elicitable reports (nil) whether p, resolved as res, may answer c through
// an MCP confirmation form: p asked for the call itself, p's client is
// operated by its user, and the declaration lets the requester decide.
func elicitable(p identity.Principal, res directory.Resolution, c *Challenge) error {
	switch {
	case c.RequesterUser != p.UserID || c.RequesterAgent != p.AgentID:
		return refuse(ErrApproverNotAllowed, "elicitation answers only the session's own call; this challenge was opened for another principal")
	case !res.Interactive:
		return refuse(ErrApproverNotAllowed, "agent "+p.AgentID+" runs headless: its client's answer is not its user's; "+
			p.UserID+" approves on the approval page, signed in (an app connected over OAuth counts only if its user opted in on the consent page)")
	case riskOf(c) > res.TrustCeilingLevel():
		return refuse(ErrApproverNotAllowed, c.Command+" is "+riskName(c)+", above the tenant's trust ceiling "+res.TrustCeiling+
			" for answers given in an app's own window: "+p.UserID+" approves it on the approval page, signed in")
	}
	return CheckElicitable(c)
}

// riskName is the challenge's declared risk, "L0" … "L4".
func riskName(c *Challenge) string {
	if c.Risk != "" {
		return c.Risk
	}
	return c.Prompt.Risk
}

// riskOf is riskName as a level; an unknown risk counts as L4, the
// strictest.
func riskOf(c *Challenge) int {
	if l := manifest.RiskLevel(riskName(c)); l >= 0 {
		return l
	}
	return 4
}

// CanDecide reports (nil) whether p may decide c, apart from its state; the
// approval page uses it to offer the buttons only to those who may press
// them.
func (s *Service) CanDecide(ctx context.Context, p identity.Principal, c Challenge) error {
	if p.Kind != identity.KindUser || p.AgentID != "" {
		return refuse(ErrApproverNotAllowed, "agents never approve or decline; a human must")
	}
	res, err := s.resolve(ctx, p)
	if err != nil {
		return err
	}
	return mayDecide(p, res, &c)
}

// Redeem uses the grant of an approved challenge for the invocation that p
// — the requester, relayed by a Mandate service — is making; digest is that
// invocation's digest. It succeeds once.
func (s *Service) Redeem(ctx context.Context, p identity.Principal, id, digest, declaration string) (Grant, error) {
	if err := relayed(p, "redeem a grant"); err != nil {
		return Grant{}, err
	}
	if !ValidDigest(digest) {
		return Grant{}, Invalid("invocation_digest", "must be 64 lower-case hex characters")
	}
	if !ValidID(id) {
		return Grant{}, ErrNotFound
	}
	res, err := s.resolve(ctx, p)
	if err != nil {
		return Grant{}, err
	}
	c, err := s.store.Get(ctx, p.Tenant, id)
	if err != nil {
		return Grant{}, err
	}
	if c.RequesterUser != p.UserID || c.RequesterAgent != p.AgentID {
		return Grant{}, refuse(ErrGrantMismatch, "the grant was given for another principal's invocation")
	}
	// A revocation voids what was asked for before it: re-enabling the
	// user or the agent does not bring an old approval back.
	if res.IssuedBefore(c.CreatedAt) {
		s.log.WarnContext(ctx, "grant refused: asked for before a revocation", "tenant", p.Tenant, "challenge_id", id,
			"invocation_id", c.InvocationID, "command", c.Command)
		return Grant{}, ErrRevoked
	}
	// An approval holds for the declaration it was given under: after a
	// redeploy that changed the command, it is refused and left unused.
	if declaration == "" {
		declaration = s.commands.DeclarationDigest(c.Command)
	}
	if was := c.Prompt.DeclarationDigest; was != "" && was != declaration {
		s.log.WarnContext(ctx, "grant refused: the command's declaration changed since the approval", "tenant", p.Tenant, "challenge_id", id,
			"invocation_id", c.InvocationID, "command", c.Command)
		return Grant{}, ErrDeclarationChanged
	}
	redeemed, err := s.store.Redeem(ctx, p.Tenant, id, digest)
	if err != nil {
		return Grant{}, err
	}
	g := GrantOf(redeemed)
	if g.Approver == "" {
		// Stores refuse to hold such a row; never hand out an anonymous grant.
		return Grant{}, fmt.Errorf("confirm: redeemed challenge %s has no approver", id)
	}
	s.log.InfoContext(ctx, "grant redeemed", "tenant", p.Tenant, "challenge_id", id,
		"invocation_id", redeemed.InvocationID, "command", redeemed.Command, "approver", g.Approver)
	return g, nil
}

// Release gives back the grant of challenge id, which the executor redeemed
// for the invocation p is making (digest) and whose call provably did not
// run: nothing was dispatched, or the backend's receipt says it was not
// executed. The approval can then be redeemed once more, by the same
// invocation digest only: still one effect per approval.
func (s *Service) Release(ctx context.Context, p identity.Principal, id, digest string) (Challenge, error) {
	if err := relayed(p, "release a grant"); err != nil {
		return Challenge{}, err
	}
	if !ValidDigest(digest) {
		return Challenge{}, Invalid("invocation_digest", "must be 64 lower-case hex characters")
	}
	if !ValidID(id) {
		return Challenge{}, ErrNotFound
	}
	if _, err := s.resolve(ctx, p); err != nil {
		return Challenge{}, err
	}
	c, err := s.store.Get(ctx, p.Tenant, id)
	if err != nil {
		return Challenge{}, err
	}
	if c.RequesterUser != p.UserID || c.RequesterAgent != p.AgentID {
		return Challenge{}, refuse(ErrGrantMismatch, "the grant was given for another principal's invocation")
	}
	released, err := s.store.Release(ctx, p.Tenant, id, digest)
	if err != nil {
		return Challenge{}, err
	}
	s.log.InfoContext(ctx, "grant released: its call did not run", "tenant", p.Tenant, "challenge_id", id,
		"invocation_id", released.InvocationID, "command", released.Command)
	return released, nil
}

// pendingWindow bounds how many of a tenant's pending challenges Pending
// reads before filtering them by visibility.
const pendingWindow = 500

// Pending lists the pending challenges of p's tenant that p may see, newest
// first, at most limit.
func (s *Service) Pending(ctx context.Context, p identity.Principal, limit int) ([]Challenge, error) {
	if p.Tenant == "" || p.UserID == "" {
		return nil, refuse(ErrPermissionDenied, "a user's principal is needed")
	}
	res, err := s.resolve(ctx, p)
	if err != nil {
		return nil, err
	}
	// Visibility is decided here, not in the store: read a wide window, then
	// keep what p may see.
	return s.pendingWhere(ctx, p.Tenant, limit, func(c *Challenge) bool { return mayRead(p, res, c) })
}

// visible loads a challenge p may read, with p's resolution.
func (s *Service) visible(ctx context.Context, p identity.Principal, id string) (Challenge, directory.Resolution, error) {
	if p.Tenant == "" || p.UserID == "" {
		return Challenge{}, directory.Resolution{}, refuse(ErrPermissionDenied, "a user's principal is needed; services call on behalf of one")
	}
	res, err := s.resolve(ctx, p)
	if err != nil {
		return Challenge{}, res, err
	}
	if !ValidID(id) {
		return Challenge{}, res, ErrNotFound
	}
	c, err := s.store.Get(ctx, p.Tenant, id)
	if err != nil {
		return Challenge{}, res, err
	}
	if !mayRead(p, res, &c) {
		return Challenge{}, res, ErrNotFound
	}
	return c, res, nil
}

// resolve asks the directory whether p is active.
func (s *Service) resolve(ctx context.Context, p identity.Principal) (directory.Resolution, error) {
	res, err := s.dir.Resolve(ctx, p.Tenant, p.UserID, p.AgentID)
	if err != nil {
		return res, Unavailable("resolve principal", err)
	}
	res = res.Admit(p.IssuedAt)
	if !res.Active {
		return res, refuse(ErrPrincipalInactive, "the principal is not active ("+res.Reason+")")
	}
	return res, nil
}

// relayed admits the callers that open and redeem: a Mandate service
// relaying the requester's principal.
func relayed(p identity.Principal, what string) error {
	if p.Kind != identity.KindService && p.Via == "" {
		return refuse(ErrPermissionDenied, "only Mandate services "+what)
	}
	if p.Tenant == "" || p.UserID == "" {
		return refuse(ErrPermissionDenied, "a service must "+what+" on behalf of the requester (x-mandate-on-behalf-of)")
	}
	return nil
}

// mayRead: the requester (any principal acting for that user) or a human
// who may decide.
func mayRead(p identity.Principal, res directory.Resolution, c *Challenge) bool {
	return p.Tenant == c.Tenant && (p.UserID == c.RequesterUser || mayDecide(p, res, c) == nil)
}

// mayDecide applies the approver policy to a human.
func mayDecide(p identity.Principal, res directory.Resolution, c *Challenge) error {
	switch {
	case p.Kind == identity.KindAgent || p.AgentID != "":
		return refuse(ErrApproverNotAllowed, "agents never approve or decline; a human must")
	case p.Kind != identity.KindUser:
		return refuse(ErrApproverNotAllowed, "only a signed-in human decides")
	case p.Tenant != c.Tenant || !res.Active || res.UserID != p.UserID:
		return refuse(ErrApproverNotAllowed, "the approver must be an active user of the tenant")
	}
	switch c.Approver.Kind {
	case ApproverRequestingUser:
		if p.UserID != c.RequesterUser {
			return refuse(ErrApproverNotAllowed, "only the user the call is made for may decide")
		}
		return nil
	case ApproverPermissionHolder:
		if p.UserID == c.RequesterUser {
			return refuse(ErrApproverNotAllowed, "four eyes: another user holding "+c.Approver.Permission+" must decide, not the requester")
		}
		if !slices.Contains(res.Permissions, c.Approver.Permission) {
			return refuse(ErrApproverNotAllowed, "deciding needs "+c.Approver.Permission)
		}
		return nil
	}
	return refuse(ErrApproverNotAllowed, "the challenge has no approver policy")
}

// Inbox lists the pending challenges of p's tenant that p may decide — the
// approver policy applied as Decide applies it (four eyes: not the
// requester's own; a permission the approver must hold) — newest first, at
// most limit. Agents have no inbox: they never decide.
func (s *Service) Inbox(ctx context.Context, p identity.Principal, limit int) ([]Challenge, error) {
	if p.Tenant == "" || p.UserID == "" {
		return nil, refuse(ErrPermissionDenied, "a user's principal is needed")
	}
	if p.Kind != identity.KindUser || p.AgentID != "" {
		return nil, refuse(ErrApproverNotAllowed, "agents never approve or decline; a human must")
	}
	res, err := s.resolve(ctx, p)
	if err != nil {
		return nil, err
	}
	return s.pendingWhere(ctx, p.Tenant, limit, func(c *Challenge) bool { return mayDecide(p, res, c) == nil })
}

// pendingWhere is the first limit of a tenant's newest pendingWindow
// pending challenges that keep accepts.
func (s *Service) pendingWhere(ctx context.Context, tenant string, limit int, keep func(*Challenge) bool) ([]Challenge, error) {
	all, err := s.store.ListPending(ctx, tenant, pendingWindow)
	if err != nil {
		return nil, err
	}
	out := make([]Challenge, 0, min(len(all), limit))
	for i := range all {
		if len(out) == limit {
			break
		}
		if keep(&all[i]) {
			out = append(out, all[i])
		}
	}
	return out, nil
}

// Amounts are the amounts of money among c's arguments as the approver
// reads them ("25.00 EUR"), in argument order; a withheld (sensitive)
// amount is never among them.
func (s *Service) Amounts(c *Challenge) []string {
	var out []string
	for _, f := range s.Fields(c) {
		if f.Kind == KindMoney && f.Problem == "" {
			out = append(out, f.Value)
		}
	}
	return out
}
