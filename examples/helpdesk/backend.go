package helpdesk

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
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

// Backend implements helpdeskv1.HelpdeskServiceServer. Register it on a server built with
// internal/server, whose interceptors authenticate callers and validate requests first.
type Backend struct {
	helpdeskv1.UnimplementedHelpdeskServiceServer

	desk    *desk
	log     *slog.Logger
	trusted []string
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
	return &Backend{
		desk:    &desk{store: cfg.Store, gateway: cfg.Gateway, now: cfg.Now},
		log:     cfg.Logger,
		trusted: slices.Clone(cfg.TrustedServices),
	}, nil
}

// Register registers the HelpdeskService on s.
func (b *Backend) Register(s grpc.ServiceRegistrar) {
	helpdeskv1.RegisterHelpdeskServiceServer(s, b)
}

// caller returns the principal of a call relayed by a Mandate service and the executor's
// metadata, or refuses a call that did not come through Mandate.
func (b *Backend) caller(ctx context.Context) (identity.Principal, Invocation, error) {
	inv, err := InvocationFromContext(ctx)
	if err != nil {
		return identity.Principal{}, inv, err
	}
	p, ok := identity.FromContext(ctx)
	if !ok || p.Tenant == "" || p.UserID == "" {
		// The server's interceptor authenticates every call; reaching here means it was not
		// installed, which must not turn into serving an anonymous caller.
		return p, inv, failure.New(identity.Stage, identity.CodeMissingCredentials, "no authenticated caller")
	}
	if p.Via == "" || (len(b.trusted) > 0 && !slices.Contains(b.trusted, p.Via)) {
		return p, inv, failure.New(StageScopeCheck, CodeNotViaExecutor,
			"the helpdesk backend only serves calls made through Mandate; call the command through the executor")
	}
	return p, inv, nil
}

// fail is the one place where the backend's errors become gRPC errors: refusals keep their
// stage and code; store outages become a retriable helpdesk.unavailable; anything else is
// logged and becomes a generic internal error.
func (b *Backend) fail(ctx context.Context, method string, p identity.Principal, inv Invocation, err error) error {
	log := b.log.With("method", method, "invocation_id", inv.ID, "tenant", p.Tenant, "user", p.UserID)
	var fe *failure.Error
	switch {
	case errors.As(err, &fe):
		log.InfoContext(ctx, "refused", "stage", fe.Stage, "code", fe.Code)
		return withInvocation(fe, inv).GRPCStatus().Err()
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		log.InfoContext(ctx, "abandoned", "error", err)
		return failure.ToStatus(err).Err()
	case errors.Is(err, ErrUnavailable):
		log.WarnContext(ctx, "store unavailable", "error", err)
		e := failure.New(StageDispatch, CodeUnavailable, "the helpdesk store is unavailable; nothing was changed")
		e.Retriable, e.Remedy = true, "retry later"
		return withInvocation(e, inv).GRPCStatus().Err()
	default:
		log.ErrorContext(ctx, "failed", "error", err)
		return withInvocation(failure.Internal(StageDispatch, err), inv).GRPCStatus().Err()
	}
}

// SearchTickets implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) SearchTickets(ctx context.Context, req *helpdeskv1.SearchTicketsRequest) (*helpdeskv1.SearchTicketsResponse, error) {
	p, inv, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "SearchTickets", p, inv, err)
	}
	tickets, next, err := b.desk.searchTickets(ctx, p, searchFromProto(req))
	if err != nil {
		return nil, b.fail(ctx, "SearchTickets", p, inv, err)
	}
	resp := &helpdeskv1.SearchTicketsResponse{NextPageToken: next, Tickets: make([]*helpdeskv1.Ticket, 0, len(tickets))}
	for _, t := range tickets {
		resp.Tickets = append(resp.Tickets, ticketToProto(t))
	}
	return resp, nil
}

// GetTicket implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) GetTicket(ctx context.Context, req *helpdeskv1.GetTicketRequest) (*helpdeskv1.Ticket, error) {
	p, inv, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "GetTicket", p, inv, err)
	}
	t, err := b.desk.getTicket(ctx, p, req.GetTicketId())
	if err != nil {
		return nil, b.fail(ctx, "GetTicket", p, inv, err)
	}
	return ticketToProto(t), nil
}

// IssueRefund implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) IssueRefund(ctx context.Context, req *helpdeskv1.IssueRefundRequest) (*helpdeskv1.Refund, error) {
	p, inv, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "IssueRefund", p, inv, err)
	}
	r, err := b.desk.issueRefund(ctx, p, inv, refundInput{
		TicketID: req.GetTicketId(), Amount: moneyFromProto(req.GetAmount()),
		Reason: req.GetReason(), CardholderReference: req.GetCardholderReference(),
	})
	if err != nil {
		return nil, b.fail(ctx, "IssueRefund", p, inv, err)
	}
	b.log.InfoContext(ctx, "refunded", "invocation_id", inv.ID, "tenant", p.Tenant, "user", p.UserID,
		"ticket", r.TicketID, "refund", r.ID, "currency", r.Amount.Currency, "amount_minor", r.Amount.Minor)
	return refundToProto(r), nil
}

// CreateExpenseReport implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) CreateExpenseReport(ctx context.Context, req *helpdeskv1.CreateExpenseReportRequest) (*helpdeskv1.ExpenseReport, error) {
	p, inv, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "CreateExpenseReport", p, inv, err)
	}
	r, err := b.desk.createReport(ctx, p, inv, createFromProto(req))
	if err != nil {
		return nil, b.fail(ctx, "CreateExpenseReport", p, inv, err)
	}
	return reportToProto(r), nil
}

// SubmitExpenseReport implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) SubmitExpenseReport(ctx context.Context, req *helpdeskv1.SubmitExpenseReportRequest) (*helpdeskv1.ExpenseReport, error) {
	p, inv, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "SubmitExpenseReport", p, inv, err)
	}
	r, err := b.desk.submitReport(ctx, p, req.GetReportId(), req.GetNote())
	if err != nil {
		return nil, b.fail(ctx, "SubmitExpenseReport", p, inv, err)
	}
	return reportToProto(r), nil
}

// RecallExpenseReport implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) RecallExpenseReport(ctx context.Context, req *helpdeskv1.RecallExpenseReportRequest) (*helpdeskv1.ExpenseReport, error) {
	p, inv, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "RecallExpenseReport", p, inv, err)
	}
	r, err := b.desk.recallReport(ctx, p, req.GetReportId(), req.GetReason())
	if err != nil {
		return nil, b.fail(ctx, "RecallExpenseReport", p, inv, err)
	}
	return reportToProto(r), nil
}

// ApproveExpenseReport implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) ApproveExpenseReport(ctx context.Context, req *helpdeskv1.ApproveExpenseReportRequest) (*helpdeskv1.ExpenseReport, error) {
	p, inv, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "ApproveExpenseReport", p, inv, err)
	}
	r, err := b.desk.approveReport(ctx, p, req.GetReportId(), req.GetComment())
	if err != nil {
		return nil, b.fail(ctx, "ApproveExpenseReport", p, inv, err)
	}
	return reportToProto(r), nil
}

// EraseCustomer implements helpdeskv1.HelpdeskServiceServer.
func (b *Backend) EraseCustomer(ctx context.Context, req *helpdeskv1.EraseCustomerRequest) (*helpdeskv1.CustomerErasure, error) {
	p, inv, err := b.caller(ctx)
	if err != nil {
		return nil, b.fail(ctx, "EraseCustomer", p, inv, err)
	}
	e, err := b.desk.eraseCustomer(ctx, p, inv, eraseInput{CustomerEmail: req.GetCustomerEmail(), Reason: req.GetReason()})
	if err != nil {
		return nil, b.fail(ctx, "EraseCustomer", p, inv, err)
	}
	// Never the email: the log would keep what the erasure removed.
	b.log.InfoContext(ctx, "customer erased", "invocation_id", inv.ID, "tenant", p.Tenant, "user", p.UserID,
		"erasure", e.ID, "tickets_erased", e.TicketsErased)
	return erasureToProto(e), nil
}
