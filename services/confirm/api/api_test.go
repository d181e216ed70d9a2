package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/directory"
	dirmem "github.com/mandate-dev/mandate/internal/directory/memory"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/storage/pgtest"
	"github.com/mandate-dev/mandate/services/confirm"
	"github.com/mandate-dev/mandate/services/confirm/api"
	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
	"github.com/mandate-dev/mandate/services/confirm/memory"
	confirmpg "github.com/mandate-dev/mandate/services/confirm/postgres"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

var (
	devSecret     = []byte("dev-secret-0123456789abcdef0123456789")
	serviceSecret = []byte("svc-secret-0123456789abcdef0123456789")
)

type env struct {
	srv     *server.Server
	conn    *grpc.ClientConn // plain: callers bring their own token
	svc     *grpc.ClientConn // as the executor: service token + on-behalf-of
	dir     directory.Store
	confirm *confirm.Service
}

type backend func(t *testing.T) confirm.Store

func memoryStore(t *testing.T) confirm.Store {
	s := memory.New(memory.Options{})
	t.Cleanup(s.Close)
	return s
}

func postgresStore(t *testing.T) confirm.Store {
	s := confirmpg.New(pgtest.New(t, confirmpg.Migrations), confirmpg.Options{})
	t.Cleanup(s.Close)
	return s
}

var backends = map[string]backend{"memory": memoryStore, "postgres": postgresStore}

func newDirectory(t *testing.T) directory.Store {
	t.Helper()
	dir := dirmem.New()
	if _, err := directory.Apply(context.Background(), dir, []byte(confirmtest.Policy)); err != nil {
		t.Fatal(err)
	}
	return dir
}

func newService(t *testing.T, store confirm.Store, dir directory.Store) *confirm.Service {
	t.Helper()
	svc, err := confirm.New(confirm.Config{
		Store: store, Directory: directory.Direct(dir), Commands: confirmtest.Commands(),
		ApprovalBaseURL: "https://confirm.example",
	})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func start(t *testing.T, store confirm.Store) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dir := newDirectory(t)
	svc := newService(t, store, dir)
	users, err := identity.NewVerifier(ctx, identity.Config{Audience: []string{"mandate"}, Issuers: []string{"test"}, DevSecret: devSecret})
	if err != nil {
		t.Fatal(err)
	}
	services, err := identity.NewServiceVerifier(identity.ServiceConfig{Secret: serviceSecret, Audience: []string{"mandate"}, Issuers: []string{"test"}})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users, Services: services})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Name: "mandate.v1.ConfirmService", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	api.New(svc, nil).Register(srv)
	srv.HandleGateway(api.Gateway)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()

	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	src, err := identity.NewServiceTokenSource(serviceSecret, "test", "mandate", "executor", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	svcConn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)), grpc.WithStreamInterceptor(identity.StreamClientInterceptor(src)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		_ = svcConn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	waitServing(t, conn)
	return &env{srv: srv, conn: conn, svc: svcConn, dir: dir, confirm: svc}
}

func waitServing(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	for range 100 {
		resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("server never became SERVING")
}

func token(t *testing.T, tenant, user, agent string) string {
	t.Helper()
	r := identity.MintRequest{Issuer: "test", Audience: "mandate", User: user, Tenant: tenant, Agent: agent, TTL: time.Hour}
	if agent != "" {
		r.Model = "test-model"
	}
	tok, err := identity.MintDev(devSecret, r)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// as calls with tok as the bearer token.
func as(tok string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
}

// relaying is the context of a call the executor makes for the holder of
// tok: the service interceptor sends its own token and forwards tok.
func relaying(tok string) context.Context {
	return identity.WithRawToken(context.Background(), tok)
}

func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

func stage(err error) string {
	for _, d := range status.Convert(err).Details() {
		if ce, ok := d.(*mandatev1.CommandError); ok {
			return ce.GetStage()
		}
	}
	return ""
}

func wantRefusal(t *testing.T, what string, err error, code codes.Code, reasonCode string) {
	t.Helper()
	if status.Code(err) != code || reason(err) != reasonCode {
		t.Fatalf("%s: got %v (%s), want %s %s", what, status.Code(err), err, code, reasonCode)
	}
	if stg := stage(err); stg != api.Stage && stg != identity.Stage {
		t.Fatalf("%s: stage %q, want %s", what, stg, api.Stage)
	}
}

var invocations atomic.Int64

func openReq(command string) *mandatev1.OpenRequest {
	inv := "inv-" + time.Now().Format("150405.000000000") + "-" + string(rune('a'+invocations.Add(1)%26))
	return &mandatev1.OpenRequest{
		Command: command, InvocationDigest: confirmtest.Digest(inv), InvocationId: inv,
		ArgumentsJson:  `{"ticket_id":"T-1","amount_cents":1250,"cardholder_reference":"[withheld]"}`,
		WithheldFields: []string{"/cardholder_reference"},
	}
}

// open opens a challenge as the executor relaying the holder of tok.
func (e *env) open(t *testing.T, tok string, req *mandatev1.OpenRequest) *mandatev1.Challenge {
	t.Helper()
	c, err := mandatev1.NewConfirmServiceClient(e.svc).Open(relaying(tok), req)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return c
}

func (e *env) decide(t *testing.T, tok, id string, d mandatev1.Decision) *mandatev1.Challenge {
	t.Helper()
	c, err := mandatev1.NewConfirmServiceClient(e.conn).Decide(as(tok), &mandatev1.DecideRequest{ChallengeId: id, Decision: d})
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	return c
}

func TestOpenAndRedeemAreForServices(t *testing.T) {
	e := start(t, memoryStore(t))
	client := mandatev1.NewConfirmServiceClient(e.conn)
	alice, bot := token(t, "acme", "alice", ""), token(t, "acme", "alice", "support-bot")
	for name, tok := range map[string]string{"alice": alice, "support-bot": bot} {
		_, err := client.Open(as(tok), openReq("ticket.refund"))
		wantRefusal(t, name+" opening directly", err, codes.PermissionDenied, "authorization.permission_denied")
	}
	_, err := client.Open(context.Background(), openReq("ticket.refund"))
	wantRefusal(t, "anonymous Open", err, codes.Unauthenticated, failure.CodeAuthenticationMissingCredentials)

	c := e.open(t, bot, openReq("ticket.refund"))
	if c.GetTenant() != "acme" || c.GetRequesterUserId() != "alice" || c.GetRequesterAgentId() != "support-bot" ||
		c.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_PENDING || c.GetApprovalUrl() != "https://confirm.example/approve/"+c.GetChallengeId() ||
		c.GetPrompt().GetTitle() != "Refund a ticket (ticket.refund)" || c.GetPrompt().GetRequestedBy() != "support-bot acting for alice" {
		t.Fatalf("opened %v", c)
	}
	e.decide(t, alice, c.GetChallengeId(), mandatev1.Decision_DECISION_APPROVE)
	redeem := &mandatev1.RedeemRequest{ChallengeId: c.GetChallengeId(), InvocationDigest: c.GetInvocationDigest()}
	_, err = client.Redeem(as(bot), redeem)
	wantRefusal(t, "the agent redeeming directly", err, codes.PermissionDenied, "authorization.permission_denied")
	g, err := mandatev1.NewConfirmServiceClient(e.svc).Redeem(relaying(bot), redeem)
	if err != nil || g.GetApprover() != "alice" || g.GetChannel() != "api" || g.GetChallengeId() != c.GetChallengeId() {
		t.Fatalf("Redeem: %v %v", g, err)
	}
	// The protovalidate rules run before the handler.
	bad := openReq("ticket.refund")
	bad.InvocationDigest = "not-hex"
	_, err = mandatev1.NewConfirmServiceClient(e.svc).Open(relaying(bot), bad)
	if status.Code(err) != codes.InvalidArgument || reason(err) != "schema.invalid" {
		t.Fatalf("malformed digest: %v", err)
	}
	long := openReq("ticket.refund")
	long.Ttl = durationpb.New(25 * time.Hour)
	_, err = mandatev1.NewConfirmServiceClient(e.svc).Open(relaying(bot), long)
	wantRefusal(t, "a 25h challenge", err, codes.InvalidArgument, "schema.invalid")
}

// TestAgentTokenDecidingIsRefused: an agent token never decides, not even
// the token of an agent whose user may approve.
func TestAgentTokenDecidingIsRefused(t *testing.T) {
	e := start(t, memoryStore(t))
	client := mandatev1.NewConfirmServiceClient(e.conn)
	bot := token(t, "acme", "alice", "support-bot")
	refund := e.open(t, bot, openReq("ticket.refund"))
	payout := e.open(t, bot, openReq("payment.payout"))
	cases := []struct {
		name, tok, id string
		ctx           func(string) context.Context
		conn          *grpc.ClientConn
	}{
		{"support-bot, alice's own refund", bot, refund.GetChallengeId(), as, e.conn},
		{"finance-bot, carol holds payment.approve", token(t, "acme", "carol", "finance-bot"), payout.GetChallengeId(), as, e.conn},
		{"support-bot relayed by a service", bot, refund.GetChallengeId(), relaying, e.svc},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mandatev1.NewConfirmServiceClient(tc.conn).Decide(tc.ctx(tc.tok), &mandatev1.DecideRequest{ChallengeId: tc.id, Decision: mandatev1.Decision_DECISION_APPROVE})
			wantRefusal(t, "Decide", err, codes.PermissionDenied, failure.CodeConfirmationApproverNotAllowed)
		})
	}
	got, err := client.Get(as(token(t, "acme", "alice", "")), &mandatev1.ConfirmServiceGetRequest{ChallengeId: refund.GetChallengeId()})
	if err != nil || got.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_PENDING {
		t.Fatalf("after the refused decisions: %v %v", got, err)
	}
}

// TestFourEyes: the requester approving her own four-eyes challenge is
// refused; another holder of the permission approves.
func TestFourEyes(t *testing.T) {
	e := start(t, memoryStore(t))
	client := mandatev1.NewConfirmServiceClient(e.conn)
	payout := e.open(t, token(t, "acme", "alice", "support-bot"), openReq("payment.payout"))
	if payout.GetApproverKind() != "PERMISSION_HOLDER" || payout.GetApproverPermission() != "payment.approve" {
		t.Fatalf("policy %s %s", payout.GetApproverKind(), payout.GetApproverPermission())
	}
	_, err := client.Decide(as(token(t, "acme", "alice", "")), &mandatev1.DecideRequest{ChallengeId: payout.GetChallengeId(), Decision: mandatev1.Decision_DECISION_APPROVE})
	wantRefusal(t, "alice approving her own payout", err, codes.PermissionDenied, failure.CodeConfirmationApproverNotAllowed)
	_, err = client.Decide(as(token(t, "acme", "mallory", "")), &mandatev1.DecideRequest{ChallengeId: payout.GetChallengeId(), Decision: mandatev1.Decision_DECISION_APPROVE})
	wantRefusal(t, "mallory, without payment.approve", err, codes.PermissionDenied, failure.CodeConfirmationApproverNotAllowed)
	_, err = client.Get(as(token(t, "acme", "mallory", "")), &mandatev1.ConfirmServiceGetRequest{ChallengeId: payout.GetChallengeId()})
	wantRefusal(t, "mallory reading it", err, codes.NotFound, failure.CodeConfirmationNotFound)
	_, err = client.Decide(as(token(t, "globex", "gina", "")), &mandatev1.DecideRequest{ChallengeId: payout.GetChallengeId(), Decision: mandatev1.Decision_DECISION_APPROVE})
	wantRefusal(t, "gina of globex", err, codes.NotFound, failure.CodeConfirmationNotFound)

	// payment.payout is L4: even carol, who holds payment.approve, cannot
	// approve it over the API; she does on the approval page, signed in.
	_, err = client.Decide(as(token(t, "acme", "carol", "")), &mandatev1.DecideRequest{ChallengeId: payout.GetChallengeId(), Decision: mandatev1.Decision_DECISION_APPROVE})
	wantRefusal(t, "carol approving an L4 payout over the API", err, codes.PermissionDenied, failure.CodeConfirmationApproverNotAllowed)
	carol := identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "carol"}
	if _, err := e.confirm.Decide(context.Background(), carol, payout.GetChallengeId(), true, confirm.ChannelApprovalPage); err != nil {
		t.Fatalf("carol approving on the page: %v", err)
	}
	got, err := client.Get(as(token(t, "acme", "carol", "")), &mandatev1.ConfirmServiceGetRequest{ChallengeId: payout.GetChallengeId()})
	if err != nil || got.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_APPROVED || got.GetDecidedBy() != "carol" || got.GetDecisionChannel() != "approval_page" || got.GetDecidedAt() == nil {
		t.Fatalf("carol's approval: %v %v", got, err)
	}
	_, err = client.Decide(as(token(t, "acme", "carol", "")), &mandatev1.DecideRequest{ChallengeId: payout.GetChallengeId(), Decision: mandatev1.Decision_DECISION_DECLINE})
	wantRefusal(t, "deciding twice", err, codes.FailedPrecondition, failure.CodeConfirmationAlreadyDecided)
}

func TestDecisionChannels(t *testing.T) {
	e := start(t, memoryStore(t))
	alice := token(t, "acme", "alice", "")
	c := e.open(t, alice, openReq("ticket.refund"))
	client := mandatev1.NewConfirmServiceClient(e.conn)
	for _, ch := range []string{"approval_page", "mcp_elicitation"} {
		_, err := client.Decide(as(alice), &mandatev1.DecideRequest{ChallengeId: c.GetChallengeId(), Decision: mandatev1.Decision_DECISION_APPROVE, Channel: ch})
		wantRefusal(t, "a direct call claiming "+ch, err, codes.InvalidArgument, "schema.invalid")
	}
	// Only the MCP bridge relays elicited answers (elicit_test.go); the
	// executor claiming the channel is refused.
	_, err := mandatev1.NewConfirmServiceClient(e.svc).Decide(relaying(alice), &mandatev1.DecideRequest{
		ChallengeId: c.GetChallengeId(), Decision: mandatev1.Decision_DECISION_APPROVE, Channel: "mcp_elicitation"})
	wantRefusal(t, "the executor relaying mcp_elicitation", err, codes.InvalidArgument, "schema.invalid")
}

// TestRedeemRefusals: replayed, expired, changed-digest, declined and
// pending grants are refused with their codes, on both stores.
func TestRedeemRefusals(t *testing.T) {
	for name, b := range backends {
		t.Run(name, func(t *testing.T) {
			e := start(t, b(t))
			bot, alice := token(t, "acme", "alice", "support-bot"), token(t, "acme", "alice", "")
			svc := mandatev1.NewConfirmServiceClient(e.svc)
			redeem := func(c *mandatev1.Challenge, digest string) error {
				if digest == "" {
					digest = c.GetInvocationDigest()
				}
				_, err := svc.Redeem(relaying(bot), &mandatev1.RedeemRequest{ChallengeId: c.GetChallengeId(), InvocationDigest: digest})
				return err
			}

			replayed := e.open(t, bot, openReq("ticket.refund"))
			e.decide(t, alice, replayed.GetChallengeId(), mandatev1.Decision_DECISION_APPROVE)
			if err := redeem(replayed, ""); err != nil {
				t.Fatal(err)
			}
			wantRefusal(t, "replayed", redeem(replayed, ""), codes.FailedPrecondition, failure.CodeConfirmationAlreadyRedeemed)

			changed := e.open(t, bot, openReq("ticket.refund"))
			e.decide(t, alice, changed.GetChallengeId(), mandatev1.Decision_DECISION_APPROVE)
			wantRefusal(t, "changed digest", redeem(changed, confirmtest.Digest("amount_cents=999999")), codes.FailedPrecondition, failure.CodeConfirmationGrantMismatch)
			if err := redeem(changed, ""); err != nil {
				t.Fatalf("the right invocation after a mismatch: %v", err)
			}

			declined := e.open(t, bot, openReq("ticket.refund"))
			e.decide(t, alice, declined.GetChallengeId(), mandatev1.Decision_DECISION_DECLINE)
			wantRefusal(t, "declined", redeem(declined, ""), codes.PermissionDenied, failure.CodeConfirmationRefused)

			pending := e.open(t, bot, openReq("ticket.refund"))
			wantRefusal(t, "pending", redeem(pending, ""), codes.FailedPrecondition, failure.CodeConfirmationPending)

			short := openReq("ticket.refund")
			short.Ttl = durationpb.New(500 * time.Millisecond)
			expired := e.open(t, bot, short)
			e.decide(t, alice, expired.GetChallengeId(), mandatev1.Decision_DECISION_APPROVE)
			time.Sleep(700 * time.Millisecond)
			wantRefusal(t, "expired", redeem(expired, ""), codes.FailedPrecondition, failure.CodeConfirmationExpired)
			lateReq := openReq("ticket.refund")
			lateReq.Ttl = durationpb.New(300 * time.Millisecond)
			late := e.open(t, bot, lateReq)
			time.Sleep(500 * time.Millisecond)
			_, err := mandatev1.NewConfirmServiceClient(e.conn).Decide(as(alice), &mandatev1.DecideRequest{ChallengeId: late.GetChallengeId(), Decision: mandatev1.Decision_DECISION_APPROVE})
			wantRefusal(t, "deciding after expiry", err, codes.FailedPrecondition, failure.CodeConfirmationExpired)
		})
	}
}

// TestConcurrentRedeems: 64 concurrent Redeem calls over gRPC for one
// approved challenge; exactly one gets the grant.
func TestConcurrentRedeems(t *testing.T) {
	for name, b := range backends {
		t.Run(name, func(t *testing.T) {
			e := start(t, b(t))
			bot := token(t, "acme", "alice", "support-bot")
			c := e.open(t, bot, openReq("ticket.refund"))
			e.decide(t, token(t, "acme", "alice", ""), c.GetChallengeId(), mandatev1.Decision_DECISION_APPROVE)
			svc := mandatev1.NewConfirmServiceClient(e.svc)
			var won, replayed atomic.Int32
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range 64 {
				wg.Go(func() {
					<-start
					_, err := svc.Redeem(relaying(bot), &mandatev1.RedeemRequest{ChallengeId: c.GetChallengeId(), InvocationDigest: c.GetInvocationDigest()})
					switch {
					case err == nil:
						won.Add(1)
					case reason(err) == failure.CodeConfirmationAlreadyRedeemed:
						replayed.Add(1)
					default:
						t.Errorf("Redeem: %v", err)
					}
				})
			}
			close(start)
			wg.Wait()
			if won.Load() != 1 || replayed.Load() != 63 {
				t.Fatalf("%d grants, %d already_redeemed; want 1 and 63", won.Load(), replayed.Load())
			}
		})
	}
}

// TestAwaitWakesOnAnotherReplicasDecision: the agent waits on replica A;
// the user decides through replica B (its own Store and pool on the same
// database); LISTEN/NOTIFY wakes A's stream.
func TestAwaitWakesOnAnotherReplicasDecision(t *testing.T) {
	pool, dsn := pgtest.NewURL(t, confirmpg.Migrations)
	storeA := confirmpg.New(pool, confirmpg.Options{WatchPoll: time.Minute})
	t.Cleanup(storeA.Close)
	e := start(t, storeA)

	poolB, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(poolB.Close)
	storeB := confirmpg.New(poolB, confirmpg.Options{})
	t.Cleanup(storeB.Close)
	replicaB := newService(t, storeB, e.dir)

	bot := token(t, "acme", "alice", "support-bot")
	c := e.open(t, bot, openReq("ticket.refund"))
	ctx, cancel := context.WithTimeout(as(bot), 20*time.Second)
	defer cancel()
	stream, err := mandatev1.NewConfirmServiceClient(e.conn).Await(ctx, &mandatev1.AwaitRequest{ChallengeId: c.GetChallengeId()})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_PENDING {
		t.Fatalf("first: %v %v", first, err)
	}
	alice := identity.Principal{Kind: identity.KindUser, Tenant: "acme", UserID: "alice"}
	decided := time.Now()
	if _, err := replicaB.Decide(context.Background(), alice, c.GetChallengeId(), true, confirm.ChannelAPI); err != nil {
		t.Fatal(err)
	}
	got, err := stream.Recv()
	if err != nil || got.GetState() != mandatev1.ChallengeState_CHALLENGE_STATE_APPROVED || got.GetDecidedBy() != "alice" {
		t.Fatalf("after B's decision: %v %v", got, err)
	}
	if waited := time.Since(decided); waited > 5*time.Second {
		t.Fatalf("woken after %v: the notification did not arrive", waited)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("stream after the decision: %v, want EOF", err)
	}
	// Another tenant cannot wait on it.
	other, err := mandatev1.NewConfirmServiceClient(e.conn).Await(as(token(t, "globex", "gina", "")), &mandatev1.AwaitRequest{ChallengeId: c.GetChallengeId()})
	if err == nil {
		_, err = other.Recv()
	}
	wantRefusal(t, "gina awaiting", err, codes.NotFound, failure.CodeConfirmationNotFound)
}

func TestAwaitEndsAtExpiry(t *testing.T) {
	e := start(t, memoryStore(t))
	bot := token(t, "acme", "alice", "support-bot")
	req := openReq("ticket.refund")
	req.Ttl = durationpb.New(300 * time.Millisecond)
	c := e.open(t, bot, req)
	ctx, cancel := context.WithTimeout(as(bot), 10*time.Second)
	defer cancel()
	stream, err := mandatev1.NewConfirmServiceClient(e.conn).Await(ctx, &mandatev1.AwaitRequest{ChallengeId: c.GetChallengeId()})
	if err != nil {
		t.Fatal(err)
	}
	var states []mandatev1.ChallengeState
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		states = append(states, m.GetState())
	}
	if len(states) != 2 || states[1] != mandatev1.ChallengeState_CHALLENGE_STATE_EXPIRED {
		t.Fatalf("states %v, want PENDING then EXPIRED", states)
	}
}

func TestREST(t *testing.T) {
	e := start(t, memoryStore(t))
	base := "http://" + e.srv.HTTPAddr()
	svcTok, err := identity.MintService(serviceSecret, "test", "mandate", "executor", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	call := func(method, path, tok, onBehalf string, body any) (int, map[string]any) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, _ := http.NewRequestWithContext(context.Background(), method, base+path, rd)
		req.Header.Set("Authorization", "Bearer "+tok)
		if onBehalf != "" {
			req.Header.Set(identity.OnBehalfOfHeader, "Bearer "+onBehalf)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	bot, alice := token(t, "acme", "alice", "support-bot"), token(t, "acme", "alice", "")
	code, body := call(http.MethodPost, "/v1/challenges", svcTok, bot, map[string]any{
		"command": "ticket.refund", "invocation_digest": confirmtest.Digest("rest-1"), "invocation_id": "rest-1",
		"arguments_json": `{"ticket_id":"T-9"}`, "ttl": "120s",
	})
	if code != http.StatusOK || body["state"] != "CHALLENGE_STATE_PENDING" {
		t.Fatalf("POST /v1/challenges: %d %v", code, body)
	}
	id := body["challenge_id"].(string)
	cases := []struct {
		name, method, path, tok, onBehalf string
		body                              any
		status                            int
		code                              string
	}{
		{"alice reads it", http.MethodGet, "/v1/challenges/" + id, alice, "", nil, 200, ""},
		{"gina of globex", http.MethodGet, "/v1/challenges/" + id, token(t, "globex", "gina", ""), "", nil, 404, failure.CodeConfirmationNotFound},
		{"the agent approves", http.MethodPost, "/v1/challenges/" + id + ":decide", bot, "", map[string]any{"decision": "DECISION_APPROVE"}, 403, failure.CodeConfirmationApproverNotAllowed},
		{"the agent opens directly", http.MethodPost, "/v1/challenges", bot, "", map[string]any{"command": "ticket.refund", "invocation_digest": confirmtest.Digest("x"), "invocation_id": "x"}, 403, "authorization.permission_denied"},
		{"redeem before a decision", http.MethodPost, "/v1/challenges/" + id + ":redeem", svcTok, bot, map[string]any{"invocation_digest": confirmtest.Digest("rest-1")}, 422, failure.CodeConfirmationPending},
		{"alice approves", http.MethodPost, "/v1/challenges/" + id + ":decide", alice, "", map[string]any{"decision": "DECISION_APPROVE"}, 200, ""},
		{"redeem", http.MethodPost, "/v1/challenges/" + id + ":redeem", svcTok, bot, map[string]any{"invocation_digest": confirmtest.Digest("rest-1")}, 200, ""},
		{"replayed redeem", http.MethodPost, "/v1/challenges/" + id + ":redeem", svcTok, bot, map[string]any{"invocation_digest": confirmtest.Digest("rest-1")}, 422, failure.CodeConfirmationAlreadyRedeemed},
	}
	for _, tc := range cases {
		status, body := call(tc.method, tc.path, tc.tok, tc.onBehalf, tc.body)
		if status != tc.status {
			t.Fatalf("%s: status %d, want %d: %v", tc.name, status, tc.status, body)
		}
		if tc.code != "" && (body["code"] != tc.code || body["stage"] != api.Stage) {
			t.Fatalf("%s: problem %v, want code %s at stage %s", tc.name, body, tc.code, api.Stage)
		}
	}
}

// TestPromptCarriesArgumentLines: the wire prompt lists the arguments as
// the confirm service renders them by the declaration, one line each, the
// withheld value marked, so that a client such as the MCP bridge shows
// them without rendering of its own.
func TestPromptCarriesArgumentLines(t *testing.T) {
	e := start(t, memoryStore(t))
	bot := token(t, "acme", "alice", "support-bot")
	c := e.open(t, bot, openReq("ticket.refund"))
	got, err := mandatev1.NewConfirmServiceClient(e.conn).Get(as(bot), &mandatev1.ConfirmServiceGetRequest{ChallengeId: c.GetChallengeId()})
	if err != nil {
		t.Fatal(err)
	}
	cmd, _ := confirmtest.Commands().ByCode("ticket.refund")
	fields := confirm.PromptFields(cmd, c.GetPrompt().GetArgumentsJson(), c.GetPrompt().GetWithheldFields())
	want := make([]string, len(fields))
	for i, f := range fields {
		want[i] = f.Line("the agent")
	}
	for _, ch := range []*mandatev1.Challenge{c, got} {
		lines := ch.GetPrompt().GetArgumentLines()
		if !slices.Equal(lines, want) || !slices.Contains(lines, "Cardholder reference: [withheld]") {
			t.Fatalf("argument lines %q, want %q", lines, want)
		}
	}
}
