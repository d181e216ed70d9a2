package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/services/audit"
	auditapi "github.com/mandate-dev/mandate/services/audit/api"
)

// trailSource is where an operator tool reads the audit trail: the
// database itself (--database-url), or a running deployment's audit API
// (--audit-addr with --token), which answers only the token's own tenant
// and only to a holder of audit.read.
type trailSource struct {
	db, token config.Secret
	addr      string
}

// declare adds --database-url, --audit-addr and --token; one of the first
// two is required, and --token goes with --audit-addr. When --audit-addr is
// given the trail is read through it, and a --database-url (say, exported
// in the shell) is not used.
func (t *trailSource) declare(s *config.Set) {
	s.SecretVar(&t.db, "database-url", "Postgres connection string of the trail, e.g. postgres://user@host:5432/mandate (or --audit-addr)")
	s.String(&t.addr, "audit-addr", "", "gRPC address of a running audit service (mandate dev: its --grpc-addr) to read the trail through, with --token; when given, --database-url is not used")
	s.SecretVar(&t.token, "token", "with --audit-addr: a bearer token of a user holding audit.read; the API answers that user's tenant only")
	s.Check(func() error {
		switch {
		case t.addr == "" && !t.db.Set():
			return s.Errorf("database-url", "is required (or --audit-addr with --token)")
		case t.addr != "" && !t.token.Set():
			return s.Errorf("token", "is required with --audit-addr")
		case t.addr == "" && t.token.Set():
			return s.Errorf("token", "goes with --audit-addr; --database-url needs none")
		}
		return nil
	})
}

// viaAPI reports whether the trail is read through the audit API.
func (t *trailSource) viaAPI() bool { return t.addr != "" }

// chainReport is what a walk of the chain found.
type chainReport struct {
	OK      bool
	Rows    int64
	HeadSeq int64
	Break   audit.Break
}

// trailReader reads one tenant's trail.
type trailReader interface {
	Query(ctx context.Context, f audit.Filter) (audit.Page, error)
	Verify(ctx context.Context, tenant string) (chainReport, error)
}

// open returns the reader; cl closes what it opened.
func (t *trailSource) open(ctx context.Context, cl *clicore.Closers) (trailReader, error) {
	if !t.viaAPI() {
		st, err := auditDB(ctx, t.db, cl)
		if err != nil {
			return nil, err
		}
		return dbTrail{st}, nil
	}
	conn, err := grpc.NewClient(t.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("--audit-addr: %w", err)
	}
	cl.Add(func() { _ = conn.Close() })
	return apiTrail{client: mandatev1.NewAuditServiceClient(conn), token: t.token}, nil
}

type dbTrail struct{ st audit.Store }

func (d dbTrail) Query(ctx context.Context, f audit.Filter) (audit.Page, error) {
	return d.st.Query(ctx, f)
}

func (d dbTrail) Verify(ctx context.Context, tenant string) (chainReport, error) {
	rep, err := d.st.Verify(ctx, tenant)
	if err != nil {
		return chainReport{}, err
	}
	out := chainReport{OK: rep.OK, Rows: rep.Rows, HeadSeq: rep.Head.Seq}
	if rep.Break != nil {
		out.Break = *rep.Break
	}
	return out, nil
}

// apiTrail reads through the audit API with the operator's token. The API
// scopes every answer to the token's tenant: a filter naming another
// tenant is refused here rather than silently answered for the token's.
type apiTrail struct {
	client mandatev1.AuditServiceClient
	token  config.Secret
}

// apiTimeout bounds one call to the audit API.
const apiTimeout = 30 * time.Second

func (a apiTrail) call(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+a.token.Reveal()), cancel
}

func (a apiTrail) Query(ctx context.Context, f audit.Filter) (audit.Page, error) {
	req := &mandatev1.QueryRequest{
		AgentId: f.AgentID, Model: f.Model, SideEffect: f.SideEffect, Command: f.Command, Stage: f.Stage,
		Approver: f.Approver, ConversationId: f.ConversationID, Phase: string(f.Phase),
		PageSize: int32(min(max(f.PageSize, 0), audit.MaxPageSize)), PageToken: f.PageToken, //nolint:gosec // bounded just above
		Approved: f.Approved,
	}
	if !f.From.IsZero() {
		req.From = timestamppb.New(f.From)
	}
	if !f.To.IsZero() {
		req.To = timestamppb.New(f.To)
	}
	for _, k := range f.ActorKinds {
		req.ActorKinds = append(req.ActorKinds, string(k))
	}
	for _, r := range f.Risks {
		req.Risks = append(req.Risks, string(r))
	}
	for _, o := range f.Outcomes {
		req.Outcomes = append(req.Outcomes, string(o))
	}
	ctx, cancel := a.call(ctx)
	defer cancel()
	resp, err := a.client.Query(ctx, req)
	if err != nil {
		return audit.Page{}, apiError("query", err)
	}
	page := audit.Page{NextPageToken: resp.GetNextPageToken()}
	for _, r := range resp.GetRecords() {
		if f.Tenant != "" && r.GetTenant() != f.Tenant {
			return audit.Page{}, fmt.Errorf("the token reads the trail of tenant %s, not %s: drop --tenant or use a token of %s", r.GetTenant(), f.Tenant, f.Tenant)
		}
		s, err := auditapi.StoredFromProto(r)
		if err != nil {
			return audit.Page{}, fmt.Errorf("the audit API answered a record it cannot read back (seq %d): %w", r.GetSeq(), err)
		}
		page.Records = append(page.Records, s)
	}
	return page, nil
}

func (a apiTrail) Verify(ctx context.Context, _ string) (chainReport, error) {
	ctx, cancel := a.call(ctx)
	defer cancel()
	resp, err := a.client.Verify(ctx, &mandatev1.VerifyRequest{})
	if err != nil {
		return chainReport{}, apiError("verify", err)
	}
	out := chainReport{OK: resp.GetOk(), Rows: resp.GetChecked(), HeadSeq: resp.GetChecked()}
	if b := resp.GetBroken(); b != nil {
		out.Break = audit.Break{Seq: b.GetSeq(), InvocationID: b.GetInvocationId(), Phase: audit.Phase(b.GetPhase()), Problem: audit.Problem(b.GetProblem())}
	}
	return out, nil
}

func apiError(op string, err error) error {
	st := status.Convert(err)
	return errors.New("audit API " + op + ": " + st.Code().String() + ": " + st.Message())
}
