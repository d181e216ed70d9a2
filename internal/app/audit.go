package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/app/auditcmd"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/services/audit"
	auditpg "github.com/mandate-dev/mandate/services/audit/postgres"
	"github.com/mandate-dev/mandate/services/executor"
)

// runAudit dispatches `mandate audit`: the service (auditcmd, which the
// mandate-audit binary runs too) and the operator tools that read and
// resolve the trail in the database.
func runAudit(ctx context.Context, args []string, io IO) error {
	if len(args) > 0 {
		switch args[0] {
		case "query":
			return runAuditQuery(ctx, args[1:], io)
		case "verify":
			return runAuditVerify(ctx, args[1:], io)
		case "resolve":
			return runAuditResolve(ctx, args[1:], io)
		case "dead-letters":
			return runAuditDeadLetters(ctx, args[1:], io)
		}
	}
	return auditcmd.Run(ctx, args, io)
}

// auditDB opens the audit store directly, for operator tools.
func auditDB(ctx context.Context, url config.Secret, cl *clicore.Closers) (*auditpg.Store, error) {
	pool, err := clicore.OpenPool(ctx, url)
	if err != nil {
		return nil, err
	}
	cl.Add(pool.Close)
	st := auditpg.New(pool, auditpg.Options{})
	cl.Add(st.Close)
	return st, nil
}

func runAuditQuery(ctx context.Context, args []string, io IO) error {
	var (
		src                                                  trailSource
		tenant, format, from, to, agent, model, sideEffect   string
		command, stage, approver, conversation, phase, token string
		actorKinds, risks, outcomes                          []string
		approved                                             string
		limit                                                int
	)
	s := config.New("audit query", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	src.declare(s)
	s.String(&tenant, "tenant", "", "tenant whose trail to read (with --audit-addr: the token's, by default)")
	s.String(&format, "format", "table", "table or json")
	s.String(&from, "from", "", "only records at or after this RFC 3339 time")
	s.String(&to, "to", "", "only records before this RFC 3339 time")
	s.Strings(&actorKinds, "actor-kind", nil, "user, agent, service")
	s.String(&agent, "agent", "", "only this agent")
	s.String(&model, "model", "", "only this model")
	s.Strings(&risks, "risk", nil, "L0 … L4")
	s.String(&sideEffect, "side-effect", "", "only commands declaring this side effect")
	s.String(&command, "command", "", "only this command code")
	s.Strings(&outcomes, "outcome", nil, "executed, refused, failed, unknown, replayed, pending; allowed, approval_required (check rows); approved, declined (decision rows)")
	s.String(&stage, "stage", "", "only this stage")
	s.String(&approved, "approved", "", "true or false")
	s.String(&approver, "approver", "", "only calls approved by this user")
	s.String(&conversation, "conversation", "", "only this conversation")
	s.String(&phase, "phase", "", "intent, outcome, resolution, check or decision (every attempt to decide a challenge)")
	s.Int(&limit, "limit", 50, "page size (1–1000)")
	s.String(&token, "page-token", "", "continue from a previous page")
	s.Require("tenant", func() bool { return tenant == "" && !src.viaAPI() })
	filter := audit.Filter{}
	s.Check(func() error {
		var errs []error
		if format != "table" && format != "json" {
			errs = append(errs, s.Errorf("format", "must be table or json"))
		}
		for name, v := range map[string]string{"from": from, "to": to} {
			if v == "" {
				continue
			}
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				errs = append(errs, s.Errorf(name, "must be an RFC 3339 time"))
			}
			if name == "from" {
				filter.From = t
			} else {
				filter.To = t
			}
		}
		switch approved {
		case "":
		case "true", "false":
			b := approved == "true"
			filter.Approved = &b
		default:
			errs = append(errs, s.Errorf("approved", "must be true or false"))
		}
		return errors.Join(errs...)
	})
	if err := s.Parse(args); err != nil {
		return err
	}
	filter.Tenant, filter.AgentID, filter.Model, filter.SideEffect = tenant, agent, model, sideEffect
	filter.Command, filter.Stage, filter.Approver, filter.ConversationID = command, stage, approver, conversation
	filter.Phase, filter.PageSize, filter.PageToken = audit.Phase(phase), limit, token
	for _, k := range actorKinds {
		filter.ActorKinds = append(filter.ActorKinds, audit.ActorKind(k))
	}
	for _, r := range risks {
		filter.Risks = append(filter.Risks, audit.Risk(r))
	}
	for _, o := range outcomes {
		filter.Outcomes = append(filter.Outcomes, audit.Outcome(o))
	}
	var cl clicore.Closers
	defer cl.Close()
	st, err := src.open(ctx, &cl)
	if err != nil {
		return err
	}
	page, err := st.Query(ctx, filter)
	if err != nil {
		return err
	}
	if format == "json" {
		enc := json.NewEncoder(io.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Records       []audit.Stored `json:"records"`
			NextPageToken string         `json:"next_page_token"`
		}{page.Records, page.NextPageToken})
	}
	tw := tabwriter.NewWriter(io.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tPHASE\tCOMMAND\tRISK\tACTOR\tUSER\tAGENT\tOUTCOME\tCODE\tAPPROVER\tINVOCATION")
	for _, r := range page.Records {
		approver := ""
		if r.Approval != nil {
			approver = r.Approval.Approver + " (" + r.Approval.Assurance() + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Seq, r.Time.UTC().Format(time.RFC3339),
			r.Phase, r.Command, r.Risk, r.ActorKind, r.UserID, r.AgentID, r.Outcome, r.Code, approver, r.InvocationID)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.NextPageToken != "" {
		fmt.Fprintf(io.Stdout, "\nmore: --page-token %s\n", page.NextPageToken)
	}
	return nil
}

func runAuditVerify(ctx context.Context, args []string, io IO) error {
	var (
		src    trailSource
		tenant string
	)
	s := config.New("audit verify", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	src.declare(s)
	s.String(&tenant, "tenant", "", "tenant whose chain to walk (with --audit-addr: the token's; this flag is refused there)")
	s.Require("tenant", func() bool { return tenant == "" && !src.viaAPI() })
	s.Check(func() error {
		if tenant != "" && src.viaAPI() {
			return s.Errorf("tenant", "the audit API walks the chain of the token's own tenant: drop --tenant")
		}
		return nil
	})
	if err := s.Parse(args); err != nil {
		return err
	}
	var cl clicore.Closers
	defer cl.Close()
	st, err := src.open(ctx, &cl)
	if err != nil {
		return err
	}
	rep, err := st.Verify(ctx, tenant)
	if err != nil {
		return err
	}
	if tenant == "" {
		tenant = "of the token's tenant"
	} else {
		tenant = "of tenant " + tenant
	}
	if rep.OK {
		fmt.Fprintf(io.Stdout, "chain %s intact: %d records, head seq %d\n", tenant, rep.Rows, rep.HeadSeq)
		return nil
	}
	b := rep.Break
	fmt.Fprintf(io.Stdout, "chain %s BROKEN at seq %d (invocation %s, phase %s): %s — %s\n",
		tenant, b.Seq, orDash(b.InvocationID), orDash(string(b.Phase)), b.Problem, orDash(b.Detail))
	return fmt.Errorf("audit chain broken at seq %d", b.Seq)
}

func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}

// runAuditResolve records an operator's verdict on an invocation whose
// outcome is unknown — its backend could not say whether it ran — through
// ExecutorService.Resolve, with the operator's own token: the executor
// checks that the token's user holds audit.resolve (and audit.read), asks
// the backend's receipt, refuses a verdict the receipt contradicts unless
// --override-receipt, appends the resolution row naming that user, and
// releases the idempotency key the call holds ("not-executed": a retry
// runs) or settles it ("executed": retries answer that it ran).
func runAuditResolve(ctx context.Context, args []string, io IO) error {
	var (
		token                config.Secret
		addr, invocation, as string
		reason               string
		override             bool
	)
	s := config.New("audit resolve", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	s.String(&addr, "executor-addr", "127.0.0.1:9092", "gRPC address of the executor (mandate dev: its --grpc-addr)")
	s.SecretVar(&token, "token", "the operator's bearer token: a user holding audit.resolve and audit.read, recorded as the resolution's user")
	s.String(&invocation, "invocation", "", "the invocation whose outcome is unknown")
	s.String(&as, "as", "", "the verdict: executed or not-executed")
	s.String(&reason, "reason", "", "why, e.g. what the system of record shows (recorded; one line, at most 500 bytes)")
	s.Bool(&override, "override-receipt", false, "record the verdict even though the backend's receipt says otherwise (recorded)")
	s.Require("token", func() bool { return !token.Set() })
	for _, f := range []struct {
		name string
		v    *string
	}{{"invocation", &invocation}, {"as", &as}, {"reason", &reason}} {
		s.Require(f.name, func() bool { return *f.v == "" })
	}
	verdict := ""
	s.Check(func() error {
		switch as {
		case "executed":
			verdict = executor.VerdictExecuted
		case "not-executed", "not_executed":
			verdict = executor.VerdictNotExecuted
		default:
			return s.Errorf("as", "must be executed or not-executed")
		}
		if err := executor.CheckReason(reason); err != nil {
			return s.Errorf("reason", "%s", failure.ToStatus(err).Message())
		}
		return nil
	})
	if err := s.Parse(args); err != nil {
		return err
	}
	ctx, client, done, err := operatorExecutor(ctx, addr, token)
	if err != nil {
		return err
	}
	defer done()
	resp, err := client.Resolve(ctx, &mandatev1.ResolveRequest{
		InvocationId: invocation, Verdict: verdict, Reason: reason, OverrideReceipt: override,
	})
	if err != nil {
		return fmt.Errorf("resolve: %s", status.Convert(err).Message())
	}
	key := map[string]string{
		"none":     "it held no idempotency key",
		"released": "its idempotency key is released: a retry runs",
		"settled":  "its idempotency key now replays that it ran",
	}[resp.GetKey()]
	receipt := "the backend could not say"
	if r := resp.GetReceipt(); r != "" {
		receipt = "the backend's receipt says " + r
	}
	rec := resp.GetRecord()
	fmt.Fprintf(io.Stdout, "invocation %s of tenant %s resolved as %s by %s (seq %d); %s; %s\n",
		invocation, rec.GetTenant(), as, rec.GetUserId(), rec.GetSeq(), receipt, key)
	return nil
}

// runAuditDeadLetters lists the audit rows of the operator's tenant that
// the trail refused outright and the executor keeps in its dead letter
// (ExecutorService.ListDeadLetters), or re-drives them (--redrive with
// --id or --all, and --reason): they go back to the executor's spool,
// whose flusher appends them to the trail within seconds.
func runAuditDeadLetters(ctx context.Context, args []string, io IO) error {
	var (
		token        config.Secret
		addr, reason string
		format       string
		ids          []string
		redrive, all bool
		limit        int
	)
	s := config.New("audit dead-letters", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	s.String(&addr, "executor-addr", "127.0.0.1:9092", "gRPC address of the executor (mandate dev: its --grpc-addr)")
	s.SecretVar(&token, "token", "the operator's bearer token: a user holding audit.resolve and audit.read; the token's tenant only")
	s.String(&format, "format", "table", "table or json")
	s.Int(&limit, "limit", 100, "list at most this many rows, oldest first (at most 1000)")
	s.Bool(&redrive, "redrive", false, "put rows back in the executor's spool instead of listing them (with --id or --all, and --reason)")
	s.Strings(&ids, "id", nil, "with --redrive: the rows to re-drive (their ids in the listing)")
	s.Bool(&all, "all", false, "with --redrive: every row of the tenant")
	s.String(&reason, "reason", "", "with --redrive: why, e.g. what was fixed (logged with your name; one line, at most 500 bytes)")
	s.Require("token", func() bool { return !token.Set() })
	var rowIDs []int64
	s.Check(func() error {
		if format != "table" && format != "json" {
			return s.Errorf("format", "must be table or json")
		}
		if limit < 1 || limit > 1000 {
			return s.Errorf("limit", "must be between 1 and 1000")
		}
		for _, id := range ids {
			n, err := strconv.ParseInt(id, 10, 64)
			if err != nil || n <= 0 {
				return s.Errorf("id", "%q is not a row id (a positive integer from the listing)", id)
			}
			rowIDs = append(rowIDs, n)
		}
		if !redrive {
			if len(ids) > 0 || all || reason != "" {
				return s.Errorf("redrive", "--id, --all and --reason re-drive rows: add --redrive")
			}
			return nil
		}
		if all == (len(ids) > 0) {
			return s.Errorf("redrive", "name the rows with --id, or --all, not both")
		}
		if err := executor.CheckReason(reason); err != nil {
			return s.Errorf("reason", "%s", failure.ToStatus(err).Message())
		}
		return nil
	})
	if err := s.Parse(args); err != nil {
		return err
	}
	ctx, client, done, err := operatorExecutor(ctx, addr, token)
	if err != nil {
		return err
	}
	defer done()
	if redrive {
		resp, err := client.RedriveDeadLetters(ctx, &mandatev1.RedriveDeadLettersRequest{Ids: rowIDs, All: all, Reason: reason})
		if err != nil {
			return fmt.Errorf("redrive: %s", status.Convert(err).Message())
		}
		fmt.Fprintf(io.Stdout, "%d row(s) back in the executor's spool; they reach the trail within seconds (a row the trail still refuses returns here)\n", resp.GetRedriven())
		return nil
	}
	resp, err := client.ListDeadLetters(ctx, &mandatev1.ListDeadLettersRequest{Limit: int32(limit)}) //nolint:gosec // G115: checked to be at most 1000
	if err != nil {
		return fmt.Errorf("dead letters: %s", status.Convert(err).Message())
	}
	if format == "json" {
		out := make([]json.RawMessage, 0, len(resp.GetDeadLetters()))
		for _, d := range resp.GetDeadLetters() {
			b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(d)
			if err != nil {
				return err
			}
			out = append(out, b)
		}
		enc := json.NewEncoder(io.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	if len(resp.GetDeadLetters()) == 0 {
		fmt.Fprintln(io.Stdout, "the dead letter is empty: every row reached the trail")
		return nil
	}
	tw := tabwriter.NewWriter(io.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tDEAD AT\tINVOCATION\tPHASE\tCOMMAND\tREASON")
	for _, d := range resp.GetDeadLetters() {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", d.GetId(), d.GetDeadAt().AsTime().Format(time.RFC3339), d.GetInvocationId(),
			d.GetRecord().GetPhase(), d.GetRecord().GetCommand(), oneLine(d.GetReason()))
	}
	return tw.Flush()
}

// oneLine keeps a table row on one line.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}

// operatorExecutor is the executor's client at addr for an operator's
// command, with ctx carrying the operator's token; done closes it.
func operatorExecutor(ctx context.Context, addr string, token config.Secret) (context.Context, mandatev1.ExecutorServiceClient, func(), error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--executor-addr: %w", err)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token.Reveal())
	return ctx, mandatev1.NewExecutorServiceClient(conn), func() { _ = conn.Close() }, nil
}
