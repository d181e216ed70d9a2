package receipt

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
)

// HandlerConfig configures a Handler over a backend's transactions of type Tx.
type HandlerConfig[Tx any] struct {
	// Store keeps the receipts. Required.
	Store Store[Tx]
	// InTx runs fn in one transaction of the backend's database, the same kind its effects
	// run in: committed when fn returns nil, rolled back otherwise. Required.
	InTx func(ctx context.Context, fn func(tx Tx) error) error
	// Trust names the Mandate services that may ask; the zero value admits any.
	Trust Trust
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now; tests fix it.
	Now func() time.Time
}

// Handler implements mandatev1.ReceiptServiceServer over a Store. A backend registers it on the
// gRPC server that serves its commands, whose interceptors authenticate callers and validate
// requests first; it answers Mandate services only (a service token, alone or relaying a user).
type Handler[Tx any] struct {
	mandatev1.UnimplementedReceiptServiceServer

	cfg HandlerConfig[Tx]
}

var _ mandatev1.ReceiptServiceServer = (*Handler[MemoryTx])(nil)

// NewHandler validates cfg and returns a Handler.
func NewHandler[Tx any](cfg HandlerConfig[Tx]) (*Handler[Tx], error) {
	if cfg.Store == nil {
		return nil, errors.New("receipt: HandlerConfig.Store is required")
	}
	if cfg.InTx == nil {
		return nil, errors.New("receipt: HandlerConfig.InTx is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Handler[Tx]{cfg: cfg}, nil
}

// Register registers the ReceiptService on s.
func (h *Handler[Tx]) Register(s grpc.ServiceRegistrar) {
	mandatev1.RegisterReceiptServiceServer(s, h)
}

// GetReceipt implements mandatev1.ReceiptServiceServer: the receipt of the invocation, or, when
// there is none, NOT_EXECUTED recorded in the same transaction (see [Resolve]).
func (h *Handler[Tx]) GetReceipt(ctx context.Context, req *mandatev1.GetReceiptRequest) (*mandatev1.Receipt, error) {
	id := req.GetInvocationId()
	log := h.cfg.Logger.With("method", "GetReceipt", "invocation_id", id)
	if err := h.cfg.Trust.service(ctx); err != nil {
		log.InfoContext(ctx, "refused", "error", err)
		return nil, failure.ToStatus(err).Err()
	}
	if id == "" || len(id) > MaxInvocationIDLen {
		// The server's validation refuses this first; the handler does not rely on it.
		e := failure.New(failure.StageSchema, failure.CodeSchemaInvalid, "invocation_id must be 1 to 128 bytes")
		e.Violations = []failure.Violation{{Pointer: "/invocationId", Rule: "string.len", Message: e.Message}}
		return nil, e.GRPCStatus().Err()
	}
	var r Receipt
	err := h.cfg.InTx(ctx, func(tx Tx) error {
		var err error
		r, err = Resolve(ctx, tx, h.cfg.Store, id, h.cfg.Now())
		return err
	})
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return nil, failure.ToStatus(err).Err()
	case err != nil:
		// Never the store's text: the executor keeps asking until a receipt store answers.
		log.WarnContext(ctx, "receipt store failed", "error", err)
		e := failure.Wrap(StageDispatch, CodeUnavailable, "the receipt could not be read; nothing was recorded", err)
		e.Retriable, e.Remedy, e.InvocationID = true, "retry later", id
		return nil, e.GRPCStatus().Err()
	}
	log.InfoContext(ctx, "receipt", "state", string(r.State), "receipt_method", r.Method)
	return r.Proto(), nil
}
