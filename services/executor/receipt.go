package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/schema"
)

// ReceiptReader asks a command's backend whether it executed an
// invocation (mandate.v1.ReceiptService). A backend that records effect
// receipts in its own transactions can answer; its answer NOT_EXECUTED is
// final, because the backend fences the invocation id when it says so.
// *GRPCDispatcher implements it.
type ReceiptReader interface {
	Receipt(ctx context.Context, d Dispatch) (Receipt, error)
}

// Receipt is a backend's answer about one invocation.
type Receipt struct {
	// Executed: the backend committed the call's effect; Result is its
	// response. Otherwise the call never ran and never will.
	Executed bool
	Result   proto.Message
}

// ErrNoReceipt: the backend answered, but with no usable receipt (e.g. an
// unspecified state or a receipt for another method).
var ErrNoReceipt = errors.New("executor: the backend gave no usable receipt")

// Receipt implements ReceiptReader over the backend's connection.
func (g *GRPCDispatcher) Receipt(ctx context.Context, d Dispatch) (Receipt, error) {
	conn, ok := g.conns[d.Command.RPC.Service]
	if !ok {
		return Receipt{}, fmt.Errorf("%w: no backend is configured for %s", ErrNoReceipt, d.Command.RPC.Service)
	}
	r, err := mandatev1.NewReceiptServiceClient(conn).GetReceipt(ctx, &mandatev1.GetReceiptRequest{InvocationId: d.InvocationID})
	if status.Code(err) == codes.Unimplemented {
		return Receipt{}, fmt.Errorf("%w: the backend keeps no receipts", ErrNoReceipt)
	}
	if err != nil {
		return Receipt{}, err
	}
	switch r.GetState() {
	case mandatev1.ReceiptState_RECEIPT_STATE_NOT_EXECUTED:
		return Receipt{}, nil
	case mandatev1.ReceiptState_RECEIPT_STATE_EXECUTED:
		if r.GetMethod() != d.Command.RPC.FullMethod {
			return Receipt{}, fmt.Errorf("%w: the receipt is for %s", ErrNoReceipt, r.GetMethod())
		}
		out := dynamicpb.NewMessage(d.Method.Output())
		if err := schema.Unmarshal(proto.UnmarshalOptions{}, r.GetResult(), out); err != nil {
			return Receipt{}, fmt.Errorf("%w: %w", ErrNoReceipt, err)
		}
		return Receipt{Executed: true, Result: out}, nil
	}
	return Receipt{}, fmt.Errorf("%w: state %s", ErrNoReceipt, r.GetState())
}

// receiptAttempts and receiptWait bound how long a call whose effect is
// unknown waits for its backend to answer for it.
const (
	receiptAttempts = 4
	receiptWait     = 250 * time.Millisecond
	// receiptBudget bounds all of resolve's attempts together: the caller
	// waits for them, and a backend that cannot answer within it (its own
	// database hung) leaves the effect unknown for now — a retry with the
	// key, or the reconciler, asks the receipt again later.
	receiptBudget = 3 * time.Second
)

// resolve asks the backend, a few times, whether the dispatch d whose
// effect is unknown ran. ok is false when the backend cannot answer (no
// receipts, still unreachable): the effect stays unknown.
func (e *Executor) resolve(ctx context.Context, d Dispatch) (r Receipt, ok bool) {
	rr, can := e.cfg.Dispatcher.(ReceiptReader)
	if !can {
		return Receipt{}, false
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), receiptBudget)
	defer cancel()
	wait := receiptWait
	for attempt := 1; attempt <= receiptAttempts; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err := rr.Receipt(actx, d)
		cancel()
		if err == nil {
			return r, true
		}
		if errors.Is(err, ErrNoReceipt) || ctx.Err() != nil {
			return Receipt{}, false
		}
		if attempt < receiptAttempts {
			select {
			case <-ctx.Done():
				return Receipt{}, false
			case <-time.After(wait):
			}
			wait *= 2
		}
	}
	return Receipt{}, false
}
