package executor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
)

// Previewer asks a command's backend what a call would do, without doing
// it (mandate.v1.PreviewService): the backend runs its state guards and
// invariants in a read transaction of its own and answers the refusal the
// call would get, or the lines that describe its effect. *GRPCDispatcher
// implements it; a Dispatcher that does not offers no preview of any
// command, and every call is confirmed as it was before previews existed.
type Previewer interface {
	// Preview returns the backend's verdict on d, whose request is request
	// (its wire bytes), or ErrNoPreview when the backend has none for the
	// command.
	Preview(ctx context.Context, d Dispatch, request []byte) (*mandatev1.PreviewResponse, error)
}

// ErrNoPreview: the backend offers no preview of the command (it answered
// Unimplemented, or no backend is configured for it).
var ErrNoPreview = errors.New("executor: the backend offers no preview of the command")

// Preview implements Previewer over the backend's connection. It carries
// what a dispatch carries (the caller's token, forwarded by the
// connection's credentials, the invocation id and the idempotency key), so
// that the backend reads the same caller as it will when the call runs.
func (g *GRPCDispatcher) Preview(ctx context.Context, d Dispatch, request []byte) (*mandatev1.PreviewResponse, error) {
	conn, ok := g.conns[d.Command.RPC.Service]
	if !ok {
		return nil, fmt.Errorf("%w: no backend is configured for %s", ErrNoPreview, d.Command.RPC.Service)
	}
	ctx, cancel := context.WithTimeout(ctx, d.Deadline)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, MetadataInvocationID, d.InvocationID)
	if d.IdempotencyKey != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataIdempotencyKey, d.IdempotencyKey)
	}
	resp, err := mandatev1.NewPreviewServiceClient(conn).Preview(ctx, &mandatev1.PreviewRequest{
		Method: d.Command.RPC.FullMethod, Request: request, InvocationId: d.InvocationID,
	})
	if status.Code(err) == codes.Unimplemented {
		return nil, fmt.Errorf("%w: %s", ErrNoPreview, status.Convert(err).Message())
	}
	return resp, err
}

// previewed is what a backend's preview said a call would do, as the
// approver is shown it.
type previewed struct {
	effects []*mandatev1.EffectLine
	// digest is the executor's digest of the preview (previewDigest), which
	// the challenge records with the lines.
	digest string
}

// Bounds of a preview the executor accepts (mandate.v1.PreviewAllowed).
const (
	maxPreviewEffects = 16
	maxEffectText     = 512
	maxEffectKind     = 64
	maxEffectAmounts  = 8
)

// preflight asks the command's backend, before a human is asked, what the
// call would do. A refusal ends the call at once with the backend's stage
// and code, recorded as the call's one outcome row (none in check mode):
// nobody is asked to approve a call that would be refused. Otherwise the
// preview is kept on inv for the challenge (inv.preview). A backend without
// a preview, one that cannot be reached, or one whose answer breaks the
// contract leaves inv.preview nil: the human is asked without effect
// lines, as before previews existed, and the backend decides at dispatch.
func (e *Executor) preflight(ctx context.Context, inv *invocation) error {
	pv, can := e.cfg.Dispatcher.(Previewer)
	if !can {
		return nil
	}
	d := Dispatch{
		Command: inv.cmd, Method: inv.method, Request: inv.req, InvocationID: inv.id,
		IdempotencyKey: inv.call.IdempotencyKey, Deadline: e.deadline(inv.cmd),
	}
	var resp *mandatev1.PreviewResponse
	err := e.stage(ctx, StageConfirmation, func(ctx context.Context) error {
		var err error
		resp, err = pv.Preview(ctx, d, inv.canon)
		return err
	})
	log := e.logger(ctx, inv)
	switch {
	case errors.Is(err, ErrNoPreview):
		return nil
	case err != nil:
		// A backend that refuses the preview as it would refuse the call
		// (an error status carrying its stage and code) has answered too.
		if fe := backendFailure(err); isRefusalStage(fe.Stage) || clientError(fe.Status) {
			return e.refuseWith(ctx, inv, fe)
		}
		log.Warn("the backend's preview failed; asking without it", "error", err)
		return nil
	}
	if r := resp.GetRefusal(); r != nil {
		fe, ok := previewRefusal(r)
		if !ok {
			log.Warn("the backend's preview refused without a stage and code it could refuse with; asking without it",
				"code", r.GetError().GetCode(), "grpc_code", r.GetGrpcCode())
			return nil
		}
		return e.refuseWith(ctx, inv, fe)
	}
	a := resp.GetAllowed()
	if a == nil {
		log.Warn("the backend's preview gave no verdict; asking without it")
		return nil
	}
	if problem := checkPreview(a); problem != "" {
		log.Warn("the backend's preview breaks the contract; asking without it", "problem", problem)
		return nil
	}
	inv.preview = &previewed{effects: a.GetEffects(), digest: previewDigest(inv.cmd.RPC.FullMethod, a)}
	return nil
}

// previewRefusal is a preview's refusal as the dispatched call would have
// met it: through backendFailure, which keeps a backend's stage and code
// only where a dispatch's refusal keeps them. ok is false for a refusal
// that would not be one at dispatch (a fault's code, no code at all).
func previewRefusal(r *mandatev1.PreviewRefusal) (*failure.Error, bool) {
	ce := r.GetError()
	c := codes.Code(r.GetGrpcCode())
	if ce.GetCode() == "" || c == codes.OK || c > codes.Unauthenticated {
		return nil, false
	}
	sent := failure.New(ce.GetStage(), ce.GetCode(), ce.GetMessage())
	sent.Remedy, sent.Retriable, sent.Status = ce.GetRemedy(), ce.GetRetriable(), c
	for _, v := range ce.GetViolations() {
		sent.Violations = append(sent.Violations, failure.Violation{Pointer: v.GetPointer(), Rule: v.GetRule(), Message: v.GetMessage()})
	}
	// Through the status, as a dispatch's answer arrives: backendFailure
	// passes a *failure.Error at stage dispatch on unchanged.
	fe := backendFailure(sent.GRPCStatus().Err())
	if !isRefusalStage(fe.Stage) && !clientError(fe.Status) {
		return nil, false
	}
	return fe, true
}

// checkPreview says what in a backend's preview breaks the contract
// (mandate.v1.PreviewAllowed's bounds), "" when nothing does. The confirm
// service neutralises the text; the executor bounds what it forwards.
func checkPreview(a *mandatev1.PreviewAllowed) string {
	if n := len(a.GetEffects()); n > maxPreviewEffects {
		return strconv.Itoa(n) + " effect lines, more than " + strconv.Itoa(maxPreviewEffects)
	}
	if len(a.GetDigest()) > 64 {
		return "a digest longer than 64 characters"
	}
	for i, l := range a.GetEffects() {
		at := "effect line " + strconv.Itoa(i)
		switch t := l.GetText(); {
		case t == "" || len(t) > maxEffectText || !utf8.ValidString(t):
			return at + ": a text that is empty, longer than " + strconv.Itoa(maxEffectText) + " bytes or not UTF-8"
		case len(l.GetKind()) > maxEffectKind || !utf8.ValidString(l.GetKind()):
			return at + ": a kind longer than " + strconv.Itoa(maxEffectKind) + " bytes"
		case len(l.GetAmounts()) > maxEffectAmounts:
			return at + ": more than " + strconv.Itoa(maxEffectAmounts) + " amounts"
		}
	}
	return ""
}

// previewDigest binds a preview to the command's method: the lines the
// approver is shown (kind, text, amounts) and the backend's own digest,
// length-prefixed so that no two previews share an encoding.
func previewDigest(method string, a *mandatev1.PreviewAllowed) string {
	h := sha256.New()
	field := func(s string) {
		fmt.Fprintf(h, "%d:", len(s))
		h.Write([]byte(s))
	}
	field("mandate.preview.v1")
	field(method)
	field(a.GetDigest())
	field(strconv.Itoa(len(a.GetEffects())))
	for _, l := range a.GetEffects() {
		field(l.GetKind())
		field(l.GetText())
		field(strconv.Itoa(len(l.GetAmounts())))
		for _, m := range l.GetAmounts() {
			field(m.GetLabel())
			field(m.GetCurrencyCode())
			field(strconv.FormatInt(m.GetAmountMinor(), 10))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// checkPreflight is preflight in check mode, where the call would reach
// its backend (confirmationVerdict): before a challenge, and at dispatch
// of a call that needs no confirmation or carries an approved grant —
// except a call the idempotency key would answer with its first response,
// which never reaches the backend: the verdict is that response, allowed
// when it was a result and the refusal it was otherwise (a backend that
// refused the first call refuses its replays with the same stage and code).
func (e *Executor) checkPreflight(ctx context.Context, inv *invocation) error {
	if key := inv.call.IdempotencyKey; key != "" {
		k := IdemKey{Tenant: inv.p.Tenant, User: inv.p.UserID, Command: inv.cmd.Code, Key: key}
		if saved, err := e.cfg.Store.Peek(ctx, k, inv.argDigest); err == nil && saved != nil {
			_, err := replay(saved)
			if fe, ok := failure.FromStatus(status.Convert(err)); ok {
				return fe
			}
			return err
		}
	}
	return e.preflight(ctx, inv)
}
