package backend

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
)

// Effect is one line of a preview: what a call would do, as the approver reads it.
type Effect struct {
	// Kind is a short lower-case word for the kind of effect ("refund", "submit"), at most
	// 64 bytes of a-z, 0-9, '_', '.' and '-'; may be empty.
	Kind string
	// Text is the line itself, plain text without markup or line breaks, 1 to 512 bytes,
	// e.g. "refund 25.00 EUR of 49.90 EUR paid; 0.00 EUR refunded so far".
	Text string
	// Amounts are the amounts of money the line speaks of, at most 8.
	Amounts []Amount
}

// Amount is an amount of money an effect line speaks of.
type Amount struct {
	// Label says what the amount is ("refund", "paid", "refunded"), at most 64 bytes.
	Label string
	// Currency is the ISO 4217 code ("EUR").
	Currency string
	// Minor is the amount in minor units (cents for EUR).
	Minor int64
}

// Bounds of a preview, as mandate.v1.PreviewAllowed declares them.
const (
	MaxEffects       = 16
	MaxEffectText    = 512
	MaxEffectAmounts = 8
)

var (
	effectKindRE = regexp.MustCompile(`^[a-z0-9_.-]{0,64}$`)
	currencyRE   = regexp.MustCompile(`^[A-Z]{3}$`)
)

// Previews serves mandate.v1.PreviewService: the preflight through which Mandate's executor
// asks, before a human is asked to approve a call, what the call would do
// (docs/architecture/confirmation.md). Each command with a preview has one function,
// registered with HandlePreview; a method without one is answered Unimplemented, which the
// executor reads as "no preview" and asks the human as it would without this service.
//
// A preview runs the command's own state guards and invariants WITHOUT effect, in a read
// transaction of the backend's store, and returns the refusal the call would get or what it
// would do. It is advice, not a reservation: the handler of the command checks again when the
// approved call is dispatched, and refuses a state that moved in between with its own code.
//
// Register it on the server that serves the commands, behind the same Guard: the executor
// calls it as it dispatches a command, with its service token and the user's.
type Previews struct {
	mandatev1.UnimplementedPreviewServiceServer

	caller  func(context.Context) (Caller, error)
	mu      sync.RWMutex
	methods map[string]previewFunc
}

// previewFunc is a registered preview, over the request's wire bytes.
type previewFunc func(ctx context.Context, c Caller, request []byte) ([]Effect, error)

var _ mandatev1.PreviewServiceServer = (*Previews)(nil)

// NewPreviews returns a PreviewService with no previews yet. Each preview's caller is read
// with CallerFrom, or with caller when it is not nil (a backend that names the services it
// trusts with a receipt.Trust of its own and reads its callers with CallerOf).
func NewPreviews(caller func(context.Context) (Caller, error)) *Previews {
	if caller == nil {
		caller = CallerFrom
	}
	return &Previews{caller: caller, methods: map[string]previewFunc{}}
}

// HandlePreview registers preview as the preview of the RPC fullMethod — the generated
// constant, e.g. ordersv1.OrderService_CancelOrder_FullMethodName — whose request message is
// Req. preview gets the request as the executor would dispatch it and returns either the
// refusal the call would get (a *Error, exactly what the command's handler would return; the
// executor reports it with its stage and code and no human is asked) or the effect lines the
// approver is shown. Any other error (a store outage) is a fault: the executor then asks the
// human without a preview, and the handler decides at dispatch as always.
//
// HandlePreview panics when fullMethod has a preview already, or is empty.
func HandlePreview[Req any, PReq interface {
	*Req
	proto.Message
}](p *Previews, fullMethod string, preview func(ctx context.Context, c Caller, req PReq) ([]Effect, error)) {
	if fullMethod == "" || preview == nil {
		panic("backend: HandlePreview needs a method and a preview")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, dup := p.methods[fullMethod]; dup {
		panic("backend: a second preview of " + fullMethod)
	}
	p.methods[fullMethod] = func(ctx context.Context, c Caller, request []byte) ([]Effect, error) {
		req := PReq(new(Req))
		if err := proto.Unmarshal(request, req); err != nil {
			r := Refuse(StageSchemaValidate, CodeSchemaInvalid, "the request does not decode as "+string(req.ProtoReflect().Descriptor().FullName()))
			r.Status = codes.InvalidArgument
			return nil, r
		}
		return preview(ctx, c, req)
	}
}

// Register registers the PreviewService on s.
func (p *Previews) Register(s grpc.ServiceRegistrar) { mandatev1.RegisterPreviewServiceServer(s, p) }

// Preview implements mandatev1.PreviewServiceServer.
func (p *Previews) Preview(ctx context.Context, req *mandatev1.PreviewRequest) (*mandatev1.PreviewResponse, error) {
	p.mu.RLock()
	fn, ok := p.methods[req.GetMethod()]
	p.mu.RUnlock()
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this backend has no preview of "+strconv.Quote(req.GetMethod()))
	}
	c, err := p.caller(ctx)
	if err != nil {
		return nil, StatusOf(err).Err()
	}
	effects, err := fn(ctx, c, req.GetRequest())
	if err != nil {
		// A refusal as a *Error or as the status a handler returns (StatusOf reads both) is
		// the answer; anything else is the backend's fault, which the executor logs.
		st := StatusOf(err)
		if fe, ok := failure.FromStatus(st); ok && refusal(fe.Stage, st.Code()) {
			if fe.InvocationID == "" {
				fe.InvocationID = c.InvocationID
			}
			return &mandatev1.PreviewResponse{Verdict: &mandatev1.PreviewResponse_Refusal{Refusal: &mandatev1.PreviewRefusal{
				Error: fe.Proto(), GrpcCode: uint32(st.Code()),
			}}}, nil
		}
		return nil, st.Err()
	}
	allowed, err := previewAllowed(effects)
	if err != nil {
		// The backend's own bug, said plainly to the executor's log; no value of the
		// request is in it.
		return nil, status.Error(codes.Internal, "backend: the preview of "+req.GetMethod()+" "+err.Error())
	}
	return &mandatev1.PreviewResponse{Verdict: &mandatev1.PreviewResponse_Allowed{Allowed: allowed}}, nil
}

// refusal reports whether an error at stage with gRPC code c says the request, not the
// backend, is at fault: the refusal the dispatched call would get.
func refusal(stage string, c codes.Code) bool {
	switch stage {
	case StageStateCheck, StagePreInvariant, StageAssert, StagePostInvariant, StageScopeCheck, StageSchemaValidate, StageIdempotencyCheck:
		return true
	}
	switch c {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.NotFound, codes.AlreadyExists, codes.OutOfRange, codes.PermissionDenied:
		return true
	}
	return false
}

// previewAllowed checks effects against the bounds and converts them, with their digest.
func previewAllowed(effects []Effect) (*mandatev1.PreviewAllowed, error) {
	if len(effects) > MaxEffects {
		return nil, fmt.Errorf("has %d effect lines, more than %d", len(effects), MaxEffects)
	}
	out := &mandatev1.PreviewAllowed{Effects: make([]*mandatev1.EffectLine, 0, len(effects))}
	h := sha256.New()
	field := func(s string) {
		fmt.Fprintf(h, "%d:", len(s))
		h.Write([]byte(s))
	}
	field("mandate.preview.v1")
	for i, e := range effects {
		switch {
		case e.Text == "" || len(e.Text) > MaxEffectText || !utf8.ValidString(e.Text) || strings.ContainsAny(e.Text, "\r\n"):
			return nil, fmt.Errorf("has effect line %d with a text that is empty, longer than %d bytes, not UTF-8 or more than one line", i, MaxEffectText)
		case !effectKindRE.MatchString(e.Kind):
			return nil, fmt.Errorf("has effect line %d with a kind that is not a short lower-case word", i)
		case len(e.Amounts) > MaxEffectAmounts:
			return nil, fmt.Errorf("has effect line %d with more than %d amounts", i, MaxEffectAmounts)
		}
		line := &mandatev1.EffectLine{Kind: e.Kind, Text: e.Text}
		field(e.Kind)
		field(e.Text)
		for j, a := range e.Amounts {
			if !currencyRE.MatchString(a.Currency) || len(a.Label) > 64 || !utf8.ValidString(a.Label) {
				return nil, fmt.Errorf("has effect line %d with amount %d whose currency is not an ISO 4217 code or whose label is too long", i, j)
			}
			line.Amounts = append(line.Amounts, &mandatev1.EffectAmount{Label: a.Label, CurrencyCode: a.Currency, AmountMinor: a.Minor})
			field(a.Label)
			field(a.Currency)
			field(strconv.FormatInt(a.Minor, 10))
		}
		out.Effects = append(out.Effects, line)
	}
	out.Digest = hex.EncodeToString(h.Sum(nil))
	return out, nil
}
