package confirm

import (
	"context"
	"errors"
	"time"

	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
)

// Verdicts an attempt asks for (Attempt.Verdict).
const (
	VerdictApprove = "approve"
	VerdictDecline = "decline"
)

// Attempt is one attempt to decide a challenge, accepted or refused, as the
// audit trail records it (phase decision): every call of Decide and
// DecideElicited makes one, and so does a transport refusing a decision
// before it reaches them (RefuseDecision).
type Attempt struct {
	// ID is the attempt's own id, fresh for every attempt.
	ID string
	// Time is when the attempt ended.
	Time time.Time
	// Decider is the principal that tried to decide, as authenticated.
	Decider identity.Principal
	// ChallengeID is the id the attempt named.
	ChallengeID string
	// Challenge is the challenge it names, nil when that could not be read
	// (an unknown id, the store unavailable).
	Challenge *Challenge
	// Verdict is VerdictApprove or VerdictDecline, "" when the request
	// asked for neither.
	Verdict string
	// Channel is the decision channel asked for (ValidChannel, or what the
	// caller claimed).
	Channel string
	// Code and Message say why it was refused: the stable code and the
	// message the decider was shown; Code is empty when the attempt was
	// accepted.
	Code, Message string
}

// Stage is the pipeline stage of every refused attempt.
func (a *Attempt) Stage() string {
	if a.Code == "" {
		return ""
	}
	return failure.StageConfirmation
}

// Outcome is how the attempt ended: approved or declined when it was
// accepted, refused otherwise (contract.Outcome*).
func (a *Attempt) Outcome() string {
	switch {
	case a.Code != "":
		return contract.OutcomeRefused
	case a.Verdict == VerdictApprove:
		return contract.OutcomeApproved
	}
	return contract.OutcomeDeclined
}

// Assurance is how sure the trail is that the decider, not someone holding
// its agent's credentials, decided: the assurance of the channel asked
// for.
func (a *Attempt) Assurance() string {
	switch a.Channel {
	case ChannelApprovalPage:
		return contract.AssuranceSignedIn
	case ChannelMCPElicitation:
		return contract.AssuranceClientAttested
	case ChannelAPI:
		return contract.AssuranceAPICredential
	}
	return contract.AssuranceUnknown
}

// Trail records decision attempts. Record must not block the decision for
// long nor lose the row silently: the audit-backed trail (confirm/trail)
// appends it, and holds and retries it when the audit trail is
// unavailable.
type Trail interface {
	Record(ctx context.Context, a Attempt)
}

// verdict names the verdict approve asks for.
func verdict(approve bool) string {
	if approve {
		return VerdictApprove
	}
	return VerdictDecline
}

// RefuseDecision records the attempt of p to decide challenge id that a
// transport refused before it reached Decide or DecideElicited (a channel p
// may not claim, a verdict that is neither approve nor decline; verdict ""
// for those), and returns err.
func (s *Service) RefuseDecision(ctx context.Context, p identity.Principal, id, verdict, channel string, err error) error {
	s.recordAttempt(ctx, p, id, verdict, channel, nil, err)
	return err
}

// recordAttempt hands the attempt to the trail. c is the challenge when the
// attempt read it; otherwise it is read here, for the row only, when id can
// name one. err is the attempt's refusal, nil when it was accepted.
func (s *Service) recordAttempt(ctx context.Context, p identity.Principal, id, verdict, channel string, c *Challenge, err error) {
	if s.trail == nil {
		return
	}
	if p.Tenant == "" {
		// No tenant to file the row under: a service's or an
		// unauthenticated principal, refused before anything was read.
		s.log.WarnContext(ctx, "decision attempt without a tenant: no audit row", "challenge_id", id, "subject", p.Subject())
		return
	}
	if c == nil && ValidID(id) {
		if got, gerr := s.store.Get(ctx, p.Tenant, id); gerr == nil {
			c = &got
		}
	}
	a := Attempt{ID: NewID(), Time: time.Now(), Decider: p, ChallengeID: id, Challenge: c, Verdict: verdict, Channel: channel}
	if err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			a.Code, a.Message = ce.Code, ce.Message
		} else {
			a.Code, a.Message = failure.CodeInternalError, "the decision could not be recorded"
		}
	}
	s.trail.Record(ctx, a)
}
