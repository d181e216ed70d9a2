package helpdesk

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/pkg/backend"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

// Config configures a Backend.
type Config struct {
	// Store keeps the records. Required.
	Store Store
	// Gateway moves refunds. Required; NewGateway is the fake of the sample deployment.
	Gateway PaymentGateway
	// TrustedServices lists the Mandate services (service token names, e.g. "executor") whose
	// relayed calls are served. Empty means any Mandate service: a valid service token is
	// already proof of that.
	TrustedServices []string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now; tests fix it.
	Now func() time.Time
}

// Backend implements helpdeskv1.HelpdeskServiceServer, and serves mandate.v1.ReceiptService
// for its effects. Register it on a gRPC server whose interceptors authenticate callers first:
// a pkg/backend Guard's (backend.Guard.ServerOptions), or Mandate's own server's.
type Backend struct {
	helpdeskv1.UnimplementedHelpdeskServiceServer

	desk     *desk
	store    Store
	log      *slog.Logger
	trust    receipt.Trust
	receipts *receipt.Handler[Tx]
}

var _ helpdeskv1.HelpdeskServiceServer = (*Backend)(nil)

// New validates cfg and returns a Backend.
func New(cfg Config) (*Backend, error) {
	if cfg.Store == nil {
		return nil, errors.New("helpdesk: Config.Store is required")
	}
	if cfg.Gateway == nil {
		return nil, errors.New("helpdesk: Config.Gateway is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	trust := receipt.Trust{Services: slices.Clone(cfg.TrustedServices)}
	receipts, err := receipt.NewHandler(receipt.HandlerConfig[Tx]{
		Store: receipts{}, InTx: cfg.Store.InTx, Trust: trust, Logger: cfg.Logger, Now: cfg.Now,
	})
	if err != nil {
		return nil, err
	}
	return &Backend{
		desk:     &desk{store: cfg.Store, gateway: cfg.Gateway, now: cfg.Now},
		store:    cfg.Store,
		log:      cfg.Logger,
		trust:    trust,
		receipts: receipts,
	}, nil
}

// Register registers the HelpdeskService and, next to it, the ReceiptService through which
// Mandate's executor learns whether an invocation of it ran (pkg/receipt), and the
// PreviewService through which it learns, before asking a human, what a refund or a submit
// would do (pkg/backend's Previews; preview.go).
func (b *Backend) Register(s grpc.ServiceRegistrar) {
	helpdeskv1.RegisterHelpdeskServiceServer(s, b)
	b.receipts.Register(s)
	b.previews().Register(s)
}

// caller returns the caller of a call relayed by a trusted Mandate service, with the
// executor's metadata, or refuses a call that did not come through Mandate. The trust is the
// backend's own (TrustedServices), whichever interceptors the server runs; on refusal the
// caller is what is known of it, for the log.
func (b *Backend) caller(ctx context.Context) (backend.Caller, error) {
	inv, err := b.trust.FromContext(ctx)
	c, cerr := backend.CallerOf(ctx, inv)
	if err != nil {
		return c, err
	}
	return c, cerr
}

// receipts is the receipt.Store of the helpdesk: its receipts live in the Store's
// transactions, with the effects they record.
type receipts struct{}

func (receipts) Get(ctx context.Context, tx Tx, invocationID string) (receipt.Receipt, bool, error) {
	return tx.Receipt(ctx, invocationID)
}

func (receipts) Record(ctx context.Context, tx Tx, r receipt.Receipt) error {
	return tx.RecordReceipt(ctx, r)
}

// effect runs op — an effectful command — in one transaction with the invocation's receipt:
// a redelivered invocation gets the recorded response back without op running again, a fenced
// one is refused with receipt.fenced, and otherwise op's response is recorded as the receipt of
// method, committing or rolling back with op's effects.
func effect[T proto.Message](ctx context.Context, b *Backend, method string, c backend.Caller, op func(tx Tx) (T, error)) (T, error) {
	var out T
	err := b.store.InTx(ctx, func(tx Tx) error {
		var err error
		out, err = receipt.Effect(ctx, tx, receipts{}, method, c.InvocationID, func() (T, error) { return op(tx) })
		return err
	})
	return out, err
}

// fail is the one place where the backend's errors become gRPC errors: refusals (its own, and
// pkg/backend's and pkg/receipt's) keep their stage and code; store outages become a retriable
// helpdesk.unavailable; anything else is logged and becomes a generic internal error.
func (b *Backend) fail(ctx context.Context, method string, p backend.Caller, err error) error {
	log := b.log.With("method", method, "invocation_id", p.InvocationID, "tenant", p.Tenant, "user", p.UserID)
	switch r, refused := backend.AsError(err); {
	case refused:
		log.InfoContext(ctx, "refused", "stage", r.Stage, "code", r.Code)
		return withInvocation(r, p).GRPCStatus().Err()
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		log.InfoContext(ctx, "abandoned", "error", err)
		return backend.StatusOf(err).Err()
	case errors.Is(err, ErrUnavailable):
		log.WarnContext(ctx, "store unavailable", "error", err)
		e := backend.Refuse(StageDispatch, CodeUnavailable, "the helpdesk store is unavailable; nothing was changed")
		e.Status, e.Retriable, e.Remedy = codes.Unavailable, true, "retry later"
		return withInvocation(e, p).GRPCStatus().Err()
	default:
		log.ErrorContext(ctx, "failed", "error", err)
		return withInvocation(backend.Internal(err), p).GRPCStatus().Err()
	}
}

// SearchTickets implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) SearchTickets(ctx context.Context, req *helpdeskv1.SearchTicketsRequest) (*helpdeskv1.SearchTicketsResponse, error) {
	p, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "SearchTickets", p, err)
	}
	tickets, next, err := b.desk.searchTickets(ctx, p, searchFromProto(req))
	if err != nil {
		return nil, b.fail(ctx, "SearchTickets", p, err)
	}
	resp := &helpdeskv1.SearchTicketsResponse{NextPageToken: next, Tickets: make([]*helpdeskv1.Ticket, 0, len(tickets))}
	for _, t := range tickets {
		resp.Tickets = append(resp.Tickets, ticketToProto(t))
	}
	return resp, nil
}

// GetTicket implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) GetTicket(ctx context.Context, req *helpdeskv1.GetTicketRequest) (*helpdeskv1.Ticket, error) {
	p, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "GetTicket", p, err)
	}
	t, err := b.desk.getTicket(ctx, p, req.GetTicketId())
	if err != nil {
		return nil, b.fail(ctx, "GetTicket", p, err)
	}
	return ticketToProto(t), nil
}

// IssueRefund implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) IssueRefund(ctx context.Context, req *helpdeskv1.IssueRefundRequest) (*helpdeskv1.Refund, error) {
	p, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "IssueRefund", p, err)
	}
	in := refundInput{
		TicketID: req.GetTicketId(), Amount: moneyFromProto(req.GetAmount()),
		Reason: req.GetReason(), CardholderReference: req.GetCardholderReference(),
	}
	r, err := effect(ctx, b, helpdeskv1.HelpdeskService_IssueRefund_FullMethodName, p, func(tx Tx) (*helpdeskv1.Refund, error) {
		r, err := b.desk.issueRefund(ctx, tx, p, in)
		return refundToProto(r), err
	})
	if err != nil {
		return nil, b.fail(ctx, "IssueRefund", p, err)
	}
	b.log.InfoContext(ctx, "refunded", "invocation_id", p.InvocationID, "tenant", p.Tenant, "user", p.UserID,
		"ticket", r.GetTicketId(), "refund", r.GetRefundId(), "currency", r.GetAmount().GetCurrencyCode(), "amount_minor", r.GetAmount().GetAmountMinor())
	return r, nil
}

// CreateExpenseReport implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) CreateExpenseReport(ctx context.Context, req *helpdeskv1.CreateExpenseReportRequest) (*helpdeskv1.ExpenseReport, error) {
	p, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "CreateExpenseReport", p, err)
	}
	r, err := effect(ctx, b, helpdeskv1.HelpdeskService_CreateExpenseReport_FullMethodName, p, func(tx Tx) (*helpdeskv1.ExpenseReport, error) {
		r, err := b.desk.createReport(ctx, tx, p, createFromProto(req))
		return reportToProto(r), err
	})
	if err != nil {
		return nil, b.fail(ctx, "CreateExpenseReport", p, err)
	}
	return r, nil
}

// SubmitExpenseReport implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) SubmitExpenseReport(ctx context.Context, req *helpdeskv1.SubmitExpenseReportRequest) (*helpdeskv1.ExpenseReport, error) {
	p, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "SubmitExpenseReport", p, err)
	}
	r, err := effect(ctx, b, helpdeskv1.HelpdeskService_SubmitExpenseReport_FullMethodName, p, func(tx Tx) (*helpdeskv1.ExpenseReport, error) {
		r, err := b.desk.submitReport(ctx, tx, p, req.GetReportId(), req.GetNote())
		return reportToProto(r), err
	})
	if err != nil {
		return nil, b.fail(ctx, "SubmitExpenseReport", p, err)
	}
	return r, nil
}

// RecallExpenseReport implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) RecallExpenseReport(ctx context.Context, req *helpdeskv1.RecallExpenseReportRequest) (*helpdeskv1.ExpenseReport, error) {
	p, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "RecallExpenseReport", p, err)
	}
	r, err := effect(ctx, b, helpdeskv1.HelpdeskService_RecallExpenseReport_FullMethodName, p, func(tx Tx) (*helpdeskv1.ExpenseReport, error) {
		r, err := b.desk.recallReport(ctx, tx, p, req.GetReportId(), req.GetReason())
		return reportToProto(r), err
	})
	if err != nil {
		return nil, b.fail(ctx, "RecallExpenseReport", p, err)
	}
	return r, nil
}

// ApproveExpenseReport implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) ApproveExpenseReport(ctx context.Context, req *helpdeskv1.ApproveExpenseReportRequest) (*helpdeskv1.ExpenseReport, error) {
	p, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "ApproveExpenseReport", p, err)
	}
	r, err := effect(ctx, b, helpdeskv1.HelpdeskService_ApproveExpenseReport_FullMethodName, p, func(tx Tx) (*helpdeskv1.ExpenseReport, error) {
		r, err := b.desk.approveReport(ctx, tx, p, req.GetReportId(), req.GetComment())
		return reportToProto(r), err
	})
	if err != nil {
		return nil, b.fail(ctx, "ApproveExpenseReport", p, err)
	}
	return r, nil
}

// EraseCustomer implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) EraseCustomer(ctx context.Context, req *helpdeskv1.EraseCustomerRequest) (*helpdeskv1.CustomerErasure, error) {
	p, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "EraseCustomer", p, err)
	}
	e, err := effect(ctx, b, helpdeskv1.HelpdeskService_EraseCustomer_FullMethodName, p, func(tx Tx) (*helpdeskv1.CustomerErasure, error) {
		e, err := b.desk.eraseCustomer(ctx, tx, p, eraseInput{CustomerEmail: req.GetCustomerEmail(), Reason: req.GetReason()})
		return erasureToProto(e), err
	})
	if err != nil {
		return nil, b.fail(ctx, "EraseCustomer", p, err)
	}
	// Never the email: the log would keep what the erasure removed.
	b.log.InfoContext(ctx, "customer erased", "invocation_id", p.InvocationID, "tenant", p.Tenant, "user", p.UserID,
		"erasure", e.GetErasureId(), "tickets_erased", e.GetTicketsErased())
	return e, nil
}

// withInvocation attaches the invocation id to a refusal so the client can quote it.
func withInvocation(e *backend.Error, c backend.Caller) *backend.Error {
	if e.InvocationID == "" {
		e.InvocationID = c.InvocationID
	}
	return e
}
