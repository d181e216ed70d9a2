package receipt

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
)

// State says whether a backend executed an invocation.
type State string

// States of a receipt; the strings are what the stores keep.
const (
	// Executed: the effect committed with the receipt.
	Executed State = "executed"
	// NotExecuted: the invocation is fenced; no delivery of it will ever act.
	NotExecuted State = "not_executed"
)

// Receipt is what a backend recorded about one invocation.
type Receipt struct {
	// InvocationID is the executor's invocation id, the key.
	InvocationID string
	// State says whether the effect committed.
	State State
	// Method is the gRPC full method executed, e.g.
	// /examples.helpdesk.v1.HelpdeskService/IssueRefund; empty when NotExecuted.
	Method string
	// Result is the method's response, binary protobuf; empty when NotExecuted.
	Result []byte
	// RecordedAt is when the receipt or the fence was recorded.
	RecordedAt time.Time
}

// Errors of the stores (wrapped).
var (
	// ErrFenced reports a receipt recorded for an invocation that GetReceipt already resolved as
	// not executed: the transaction carrying the effect must roll back.
	ErrFenced = errors.New("receipt: the invocation is fenced as not executed")
	// ErrExecuted reports a second receipt for an invocation that already has one; the
	// effect must roll back and the recorded result be returned instead ([Replay]).
	ErrExecuted = errors.New("receipt: the invocation already has an executed receipt")
	// ErrInvalid reports a malformed receipt (a bug in the caller).
	ErrInvalid = errors.New("receipt: invalid receipt")
)

// Store keeps receipts inside the backend's transactions of type Tx: [Postgres] on a pgx.Tx,
// [Memory] on a [MemoryTx].
type Store[Tx any] interface {
	// Get returns the receipt of an invocation; found is false when there is none. It holds
	// the invocation id against concurrent transactions until tx ends, so that a delivery and
	// a fence of the same invocation run one after the other.
	Get(ctx context.Context, tx Tx, invocationID string) (r Receipt, found bool, err error)
	// Record stores r in tx. An invocation that has a receipt already fails with an error
	// matching ErrFenced (NotExecuted) or ErrExecuted, and r is not stored.
	Record(ctx context.Context, tx Tx, r Receipt) error
}

// Validate checks what a store requires of a receipt; errors match ErrInvalid.
func (r Receipt) Validate() error {
	switch {
	case r.InvocationID == "" || len(r.InvocationID) > MaxInvocationIDLen:
		return fmt.Errorf("%w: the invocation id must be 1 to %d bytes", ErrInvalid, MaxInvocationIDLen)
	case r.State == Executed && r.Method == "":
		return fmt.Errorf("%w: an executed receipt names its method", ErrInvalid)
	case r.State == NotExecuted && (r.Method != "" || len(r.Result) > 0):
		return fmt.Errorf("%w: a not-executed receipt has no method and no result", ErrInvalid)
	case r.State != Executed && r.State != NotExecuted:
		return fmt.Errorf("%w: unknown state %q", ErrInvalid, r.State)
	case r.RecordedAt.IsZero():
		return fmt.Errorf("%w: no recording time", ErrInvalid)
	}
	return nil
}

// normalize returns r as every store keeps it: the time in UTC at microsecond precision (what
// Postgres stores), an empty result as nil.
func (r Receipt) normalize() Receipt {
	r.RecordedAt = r.RecordedAt.UTC().Truncate(time.Microsecond)
	if len(r.Result) == 0 {
		r.Result = nil
	} else {
		r.Result = append([]byte(nil), r.Result...)
	}
	return r
}

// Proto returns r as the ReceiptService answers it.
func (r Receipt) Proto() *mandatev1.Receipt {
	out := &mandatev1.Receipt{
		InvocationId: r.InvocationID, Method: r.Method, Result: r.Result,
		RecordedAt: timestamppb.New(r.RecordedAt),
	}
	switch r.State {
	case Executed:
		out.State = mandatev1.ReceiptState_RECEIPT_STATE_EXECUTED
	case NotExecuted:
		out.State = mandatev1.ReceiptState_RECEIPT_STATE_NOT_EXECUTED
	}
	return out
}

// marshal is deterministic so that the same response records the same bytes.
var marshal = proto.MarshalOptions{Deterministic: true}

// Replay is what a handler calls first, inside the transaction that will carry its effect: for
// an invocation with an executed receipt it returns the recorded result (decoded as T) and true,
// and the handler returns it without acting again; for a fenced invocation it returns the
// receipt.fenced refusal (matching ErrFenced); for an unknown one it returns false, and the
// handler acts and records its receipt (see [Effect], which does all of this). An empty id is
// refused with request.invalid_metadata: without it there is no receipt to keep.
func Replay[T proto.Message, Tx any](ctx context.Context, tx Tx, store Store[Tx], invocationID string) (T, bool, error) {
	out, _, found, err := replay[T](ctx, tx, store, invocationID)
	return out, found, err
}

// replay is Replay that also returns the receipt it decoded.
func replay[T proto.Message, Tx any](ctx context.Context, tx Tx, store Store[Tx], invocationID string) (T, Receipt, bool, error) {
	var zero T
	if invocationID == "" {
		return zero, Receipt{}, false, invalidMetadata("an effectful call needs the invocation id the executor sends (" + InvocationIDHeader + ")")
	}
	r, found, err := store.Get(ctx, tx, invocationID)
	if err != nil || !found {
		return zero, Receipt{}, false, err
	}
	if r.State == NotExecuted {
		return zero, r, false, fenced(invocationID)
	}
	out := zero.ProtoReflect().New().Interface().(T)
	if err := proto.Unmarshal(r.Result, out); err != nil {
		return zero, r, false, fmt.Errorf("receipt: decoding the recorded result of %s (%s): %w", invocationID, r.Method, err)
	}
	return out, r, true, nil
}

// Effect runs op at most once per invocation, in the caller's transaction tx: a redelivered
// invocation gets its recorded result back without op running, a fenced one is refused with
// receipt.fenced, and otherwise op's result is recorded as the executed receipt of method in tx,
// so that the effect op made in tx and its receipt commit or roll back together. A refusal or
// error of op records nothing. method is the gRPC full method being served; a recorded receipt
// of another method is an error, since replaying it would answer with the wrong message.
func Effect[T proto.Message, Tx any](ctx context.Context, tx Tx, store Store[Tx], method, invocationID string, op func() (T, error)) (T, error) {
	var zero T
	if method == "" {
		return zero, errors.New("receipt: Effect needs the gRPC full method")
	}
	prior, r, found, err := replay[T](ctx, tx, store, invocationID)
	if err != nil {
		return zero, err
	}
	if found {
		if r.Method != method {
			return zero, fmt.Errorf("receipt: invocation %s was executed as %s, not %s", invocationID, r.Method, method)
		}
		return prior, nil
	}
	out, err := op()
	if err != nil {
		return zero, err
	}
	result, err := marshal.Marshal(out)
	if err != nil {
		return zero, fmt.Errorf("receipt: encoding the result of %s: %w", method, err)
	}
	err = store.Record(ctx, tx, Receipt{
		InvocationID: invocationID, State: Executed, Method: method, Result: result, RecordedAt: time.Now(),
	})
	switch {
	case errors.Is(err, ErrFenced):
		// Get holds the id, so only a store that does not serialise could get here.
		return zero, fenced(invocationID)
	case err != nil:
		return zero, err
	}
	return out, nil
}

// Resolve returns the receipt of an invocation and, when there is none, records and returns
// NotExecuted in tx (the fence GetReceipt sets), so that no delivery of it can commit later.
func Resolve[Tx any](ctx context.Context, tx Tx, store Store[Tx], invocationID string, now time.Time) (Receipt, error) {
	r, found, err := store.Get(ctx, tx, invocationID)
	if err != nil || found {
		return r, err
	}
	r = Receipt{InvocationID: invocationID, State: NotExecuted, RecordedAt: now}.normalize()
	if err := store.Record(ctx, tx, r); err != nil {
		return Receipt{}, err
	}
	return r, nil
}

// fenced is the refusal of a delivery of a fenced invocation; it matches ErrFenced.
func fenced(invocationID string) *failure.Error {
	e := failure.Wrap(StageIdempotencyCheck, CodeFenced,
		"invocation "+invocationID+" was resolved as not executed; this delivery of it will not act", ErrFenced)
	e.Status, e.InvocationID = codes.FailedPrecondition, invocationID
	e.Remedy = "call the command again as a new invocation"
	return e
}
