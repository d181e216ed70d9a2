package backend_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/pkg/backend"
	"github.com/mandate-dev/mandate/pkg/receipt"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	issuer   = "https://id.backend.test"
	audience = "mandate"
	// probeEffect is the method the probe records receipts of.
	probeEffect = "/backendtest.Probe/Effect"
)

var (
	devSecret     = []byte("backend-test-dev-secret-0123456789")
	serviceSecret = []byte("backend-test-svc-secret-0123456789")
)

// probe is a backend written as an adopter writes one: its handlers read the caller with
// backend.CallerFrom, record effects with pkg/receipt, and refuse with backend.Refuse.
type probe struct {
	receipts *receipt.Memory
	effects  int
}

// who answers the Caller as JSON.
func (p *probe) who(ctx context.Context, _ *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	c, err := backend.CallerFrom(ctx)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, backend.Internal(err)
	}
	return wrapperspb.String(string(b)), nil
}

// open answers without reading its caller: only the Guard stands before it.
func (p *probe) open(context.Context, *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	return wrapperspb.String("open"), nil
}

// effect counts one effect per invocation, with its receipt, through pkg/receipt's own
// reading of the call (receipt.FromContext), as a backend of pkg/receipt alone does.
func (p *probe) effect(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	inv, err := receipt.Trust{Services: []string{backend.DefaultRelay}}.FromContext(ctx)
	if err != nil {
		return nil, err
	}
	var out *wrapperspb.StringValue
	err = p.receipts.InTx(ctx, func(tx receipt.MemoryTx) error {
		var err error
		out, err = receipt.Effect(ctx, tx, p.receipts, probeEffect, inv.ID, func() (*wrapperspb.StringValue, error) {
			p.effects++
			return wrapperspb.String("done " + in.GetValue()), nil
		})
		return err
	})
	if err != nil {
		return nil, backend.StatusOf(err).Err()
	}
	return out, nil
}

// refuse refuses the way the helpdesk refuses a refund on a closed ticket.
func (p *probe) refuse(ctx context.Context, _ *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	c, err := backend.CallerFrom(ctx)
	if err != nil {
		return nil, err
	}
	r := backend.Refuse(backend.StageStateCheck, "state.ticket_closed", "ticket T-1 is closed")
	r.InvocationID = c.InvocationID
	return nil, r
}

// watch is a server stream that sends the caller's user id once.
func (p *probe) watch(_ *wrapperspb.StringValue, ss grpc.ServerStream) error {
	c, err := backend.CallerFrom(ss.Context())
	if err != nil {
		return err
	}
	return ss.SendMsg(wrapperspb.String(c.UserID))
}

func unary(fn func(*probe, context.Context, *wrapperspb.StringValue) (*wrapperspb.StringValue, error), name string) grpc.MethodDesc {
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(ctx context.Context, req any) (any, error) {
			return fn(srv.(*probe), ctx, req.(*wrapperspb.StringValue))
		}
		if icpt == nil {
			return h(ctx, in)
		}
		return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/backendtest.Probe/" + name}, h)
	}}
}

var probeDesc = grpc.ServiceDesc{
	ServiceName: "backendtest.Probe",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		unary((*probe).who, "Who"), unary((*probe).open, "Open"), unary((*probe).effect, "Effect"), unary((*probe).refuse, "Refuse"),
	},
	Streams: []grpc.StreamDesc{{StreamName: "Watch", ServerStreams: true, Handler: func(srv any, ss grpc.ServerStream) error {
		in := new(wrapperspb.StringValue)
		if err := ss.RecvMsg(in); err != nil {
			return err
		}
		return srv.(*probe).watch(in, ss)
	}}},
}

// env is the probe behind a Guard on a real gRPC server (over bufconn), and the ways of
// calling it.
type env struct {
	probe *probe
	lis   *bufconn.Listener
	t     *testing.T
}

func start(t *testing.T, cfg backend.Config) *env {
	t.Helper()
	guard, err := backend.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &probe{receipts: receipt.NewMemory()}
	h, err := receipt.NewHandler(receipt.HandlerConfig[receipt.MemoryTx]{
		// The zero Trust admits any Mandate service: which one may ask is the Guard's to decide.
		Store: p.receipts, InTx: p.receipts.InTx, Trust: receipt.Trust{},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(guard.ServerOptions()...)
	srv.RegisterService(&probeDesc, p)
	h.Register(srv)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis := bufconn.Listen(1 << 20)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serve: %v", err)
		}
	})
	return &env{probe: p, lis: lis, t: t}
}

// dial connects as the service named (its service token on every call and the user's token of
// the context forwarded, with identity's client interceptors, as the executor dials its
// backends), or with no credentials of its own when service is "".
func (e *env) dial(service string) *grpc.ClientConn {
	e.t.Helper()
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return e.lis.DialContext(ctx) }),
	}
	if service != "" {
		src, err := identity.NewServiceTokenSource(serviceSecret, issuer, audience, service, time.Hour)
		if err != nil {
			e.t.Fatal(err)
		}
		opts = append(opts, grpc.WithUnaryInterceptor(identity.UnaryClientInterceptor(src)),
			grpc.WithStreamInterceptor(identity.StreamClientInterceptor(src)))
	}
	conn, err := grpc.NewClient("passthrough:///probe", opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func userToken(t *testing.T, r identity.MintRequest) string {
	t.Helper()
	r.Issuer, r.Audience = issuer, audience
	if r.Tenant == "" {
		r.Tenant, r.Org = "acme", "support"
	}
	tok, err := identity.MintDev(devSecret, r)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func devConfig() backend.Config {
	return backend.Config{ServiceSecret: serviceSecret, DevSecret: devSecret, Issuers: []string{issuer}, Audience: []string{audience}}
}

// relayedBy is a context of a call the executor relays for the token's user: the user's
// token to forward, and the executor's metadata of the invocation.
func relayedBy(t *testing.T, userTok string, md ...string) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	if userTok != "" {
		ctx = identity.WithRawToken(ctx, userTok)
	}
	return metadata.AppendToOutgoingContext(ctx, md...)
}

// refusalOf returns the gRPC code, and the stage and code of the ErrorInfo and CommandError
// details, which must agree.
func refusalOf(t *testing.T, err error) (codes.Code, string, string) {
	t.Helper()
	st, _ := status.FromError(err)
	var info *errdetails.ErrorInfo
	var ce *mandatev1.CommandError
	for _, d := range st.Details() {
		switch x := d.(type) {
		case *errdetails.ErrorInfo:
			info = x
		case *mandatev1.CommandError:
			ce = x
		}
	}
	if st.Code() == codes.OK {
		return codes.OK, "", ""
	}
	if info == nil || ce == nil {
		t.Fatalf("status %v (%s) lacks ErrorInfo or CommandError: %v", st.Code(), st.Message(), st.Details())
	}
	if info.GetReason() != ce.GetCode() || info.GetMetadata()["stage"] != ce.GetStage() || info.GetDomain() != backend.ErrorDomain {
		t.Errorf("ErrorInfo %s/%s/%v disagrees with CommandError %s/%s", info.GetDomain(), info.GetReason(), info.GetMetadata(), ce.GetStage(), ce.GetCode())
	}
	return st.Code(), ce.GetStage(), ce.GetCode()
}

func TestGuardAdmitsOnlyCallsTheExecutorRelays(t *testing.T) {
	e := start(t, devConfig())
	agentTok := userToken(t, identity.MintRequest{User: "carol", Agent: "agent-7", Model: "claude", ModelVersion: "4.5"})
	expired := userToken(t, identity.MintRequest{User: "carol", Now: time.Now().Add(-2 * time.Hour), TTL: time.Minute})
	exec, bridge, none := e.dial(backend.DefaultRelay), e.dial(identity.MCPBridgeService), e.dial("")
	bearer := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(relayedBy(t, ""), "authorization", "Bearer "+tok)
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	svcTok, err := identity.MintService(serviceSecret, issuer, audience, backend.DefaultRelay, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		conn      *grpc.ClientConn
		ctx       context.Context
		wantCode  codes.Code
		wantStage string
		wantErr   string
	}{
		{"the executor relays an agent", exec, relayedBy(t, agentTok, backend.InvocationIDHeader, "inv-1", backend.ManifestDigestHeader, digest), codes.OK, "", ""},
		{"no token at all", none, relayedBy(t, ""), codes.Unauthenticated, backend.StageAuthenticate, backend.CodeAuthenticationMissingCredentials},
		{"the user calls directly", none, bearer(agentTok), codes.PermissionDenied, backend.StageScopeCheck, backend.CodeScopeNotViaExecutor},
		{"another service relays", bridge, relayedBy(t, agentTok), codes.PermissionDenied, backend.StageScopeCheck, backend.CodeScopeNotViaExecutor},
		{"the executor with no user", exec, relayedBy(t, ""), codes.PermissionDenied, backend.StageScopeCheck, backend.CodeScopeNotViaExecutor},
		{"the executor relays an expired token", exec, relayedBy(t, expired), codes.Unauthenticated, backend.StageAuthenticate, "authentication.token_expired"},
		{"a user's token as the service token", none,
			metadata.AppendToOutgoingContext(bearer(agentTok), backend.OnBehalfOfHeader, "Bearer "+agentTok),
			codes.Unauthenticated, backend.StageAuthenticate, "authentication.not_a_service"},
		{"the service token as the user's", none,
			metadata.AppendToOutgoingContext(bearer(svcTok), backend.OnBehalfOfHeader, "Bearer "+svcTok),
			codes.Unauthenticated, backend.StageAuthenticate, "authentication.invalid_token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Open does not read its caller: what it refuses, the Guard refused.
			err := tc.conn.Invoke(tc.ctx, "/backendtest.Probe/Open", wrapperspb.String(""), new(wrapperspb.StringValue))
			if code, stage, reason := refusalOf(t, err); code != tc.wantCode || stage != tc.wantStage || reason != tc.wantErr {
				t.Fatalf("Open = %v %s/%s (%v), want %v %s/%s", code, stage, reason, err, tc.wantCode, tc.wantStage, tc.wantErr)
			}
			var out wrapperspb.StringValue
			err = tc.conn.Invoke(tc.ctx, "/backendtest.Probe/Who", wrapperspb.String(""), &out)
			code, stage, reason := refusalOf(t, err)
			if code != tc.wantCode || stage != tc.wantStage || reason != tc.wantErr {
				t.Fatalf("Who = %v %s/%s (%v), want %v %s/%s", code, stage, reason, err, tc.wantCode, tc.wantStage, tc.wantErr)
			}
			if tc.wantCode != codes.OK {
				return
			}
			var got backend.Caller
			if err := json.Unmarshal([]byte(out.GetValue()), &got); err != nil {
				t.Fatal(err)
			}
			want := backend.Caller{Tenant: "acme", Org: "support", UserID: "carol", AgentID: "agent-7", Model: "claude", ModelVersion: "4.5",
				Issuer: issuer, TokenID: got.TokenID, Relay: "executor", InvocationID: "inv-1", ManifestDigest: digest}
			if got != want || got.TokenID == "" || !got.IsAgent() {
				t.Errorf("Caller = %+v, want %+v with a token id", got, want)
			}
		})
	}
}

// TestCallerFromRefusesBadMetadata: what the executor sends once is refused when it comes twice
// or malformed; Open, which does not read its caller, is served (the Guard checks tokens only).
func TestCallerFromRefusesBadMetadata(t *testing.T) {
	e := start(t, devConfig())
	tok := userToken(t, identity.MintRequest{User: "carol"})
	exec := e.dial(backend.DefaultRelay)
	digest := "sha256:" + strings.Repeat("0f", 32)
	tests := []struct {
		name      string
		md        []string
		wantStage string
		wantErr   string
	}{
		{"two invocation ids", []string{backend.InvocationIDHeader, "inv-1", backend.InvocationIDHeader, "inv-2"}, backend.StageRequestCheck, backend.CodeInvalidMetadata},
		{"an invocation id too long", []string{backend.InvocationIDHeader, strings.Repeat("i", backend.MaxInvocationIDLen+1)}, backend.StageRequestCheck, backend.CodeInvalidMetadata},
		{"two idempotency keys", []string{backend.IdempotencyKeyHeader, "k1", backend.IdempotencyKeyHeader, "k2"}, backend.StageIdempotencyCheck, backend.CodeInvalidKey},
		{"two manifest digests", []string{backend.ManifestDigestHeader, digest, backend.ManifestDigestHeader, digest}, backend.StageRequestCheck, backend.CodeInvalidMetadata},
		{"a malformed manifest digest", []string{backend.ManifestDigestHeader, "md5:abc"}, backend.StageRequestCheck, backend.CodeInvalidMetadata},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := exec.Invoke(relayedBy(t, tok, tc.md...), "/backendtest.Probe/Who", wrapperspb.String(""), new(wrapperspb.StringValue))
			if code, stage, reason := refusalOf(t, err); code != codes.InvalidArgument || stage != tc.wantStage || reason != tc.wantErr {
				t.Fatalf("Who = %v %s/%s (%v), want InvalidArgument %s/%s", code, stage, reason, err, tc.wantStage, tc.wantErr)
			}
			if err := exec.Invoke(relayedBy(t, tok, tc.md...), "/backendtest.Probe/Open", wrapperspb.String(""), new(wrapperspb.StringValue)); err != nil {
				t.Fatalf("Open = %v, want served", err)
			}
		})
	}
}

func TestGuardStreams(t *testing.T) {
	e := start(t, devConfig())
	tok := userToken(t, identity.MintRequest{User: "dave"})
	watch := func(conn *grpc.ClientConn, ctx context.Context) (string, error) {
		s, err := conn.NewStream(ctx, &probeDesc.Streams[0], "/backendtest.Probe/Watch")
		if err != nil {
			return "", err
		}
		if err := s.SendMsg(wrapperspb.String("")); err != nil {
			return "", err
		}
		if err := s.CloseSend(); err != nil {
			return "", err
		}
		var out wrapperspb.StringValue
		if err := s.RecvMsg(&out); err != nil {
			return "", err
		}
		if err := s.RecvMsg(&out); !errors.Is(err, io.EOF) {
			return "", err
		}
		return out.GetValue(), nil
	}
	got, err := watch(e.dial(backend.DefaultRelay), relayedBy(t, tok))
	if err != nil || got != "dave" {
		t.Fatalf("relayed stream = %q, %v; want dave", got, err)
	}
	_, err = watch(e.dial(identity.MCPBridgeService), relayedBy(t, tok))
	if code, _, reason := refusalOf(t, err); code != codes.PermissionDenied || reason != backend.CodeScopeNotViaExecutor {
		t.Fatalf("stream relayed by the bridge = %v %s, want PermissionDenied %s", code, reason, backend.CodeScopeNotViaExecutor)
	}
}

func TestHealthStaysPublic(t *testing.T) {
	e := start(t, devConfig())
	resp, err := healthpb.NewHealthClient(e.dial("")).Check(relayedBy(t, ""), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v; want SERVING without a token", resp.GetStatus(), err)
	}
}

// TestReceiptsBehindTheGuard: pkg/receipt, unchanged, behind the Guard: effects recorded with
// the invocation id the executor sends, asked for by the executor with its token alone (as its
// reconciler does) or for a user, fenced on a miss; nobody else may ask.
func TestReceiptsBehindTheGuard(t *testing.T) {
	e := start(t, devConfig())
	tok := userToken(t, identity.MintRequest{User: "carol"})
	exec := e.dial(backend.DefaultRelay)
	effect := func(id string) (string, error) {
		var out wrapperspb.StringValue
		err := exec.Invoke(relayedBy(t, tok, backend.InvocationIDHeader, id), probeEffect, wrapperspb.String(id), &out)
		return out.GetValue(), err
	}
	for range 2 { // the second delivery replays the receipt
		if got, err := effect("inv-ran"); err != nil || got != "done inv-ran" {
			t.Fatalf("Effect = %q, %v", got, err)
		}
	}
	if e.probe.effects != 1 {
		t.Fatalf("effects = %d after a redelivery, want 1", e.probe.effects)
	}

	receipts := mandatev1.NewReceiptServiceClient(exec)
	r, err := receipts.GetReceipt(relayedBy(t, ""), &mandatev1.GetReceiptRequest{InvocationId: "inv-ran"})
	if err != nil {
		t.Fatalf("GetReceipt by the executor alone: %v", err)
	}
	var result wrapperspb.StringValue
	if err := proto.Unmarshal(r.GetResult(), &result); err != nil || r.GetState() != mandatev1.ReceiptState_RECEIPT_STATE_EXECUTED ||
		r.GetMethod() != probeEffect || result.GetValue() != "done inv-ran" {
		t.Fatalf("receipt = %v (%q, %v), want EXECUTED of %s", r, result.GetValue(), err, probeEffect)
	}
	r, err = receipts.GetReceipt(relayedBy(t, tok), &mandatev1.GetReceiptRequest{InvocationId: "inv-lost"})
	if err != nil || r.GetState() != mandatev1.ReceiptState_RECEIPT_STATE_NOT_EXECUTED {
		t.Fatalf("receipt of a lost invocation for a user = %v, %v; want NOT_EXECUTED", r, err)
	}
	_, err = effect("inv-lost")
	if code, stage, reason := refusalOf(t, err); code != codes.FailedPrecondition || stage != backend.StageIdempotencyCheck || reason != backend.CodeReceiptFenced {
		t.Fatalf("a fenced invocation = %v %s/%s, want FailedPrecondition %s/%s", code, stage, reason, backend.StageIdempotencyCheck, backend.CodeReceiptFenced)
	}

	for name, conn := range map[string]*grpc.ClientConn{"the bridge": e.dial(identity.MCPBridgeService), "no service": e.dial("")} {
		ctx := relayedBy(t, "")
		if name == "no service" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
		}
		_, err := mandatev1.NewReceiptServiceClient(conn).GetReceipt(ctx, &mandatev1.GetReceiptRequest{InvocationId: "inv-ran"})
		if code, _, reason := refusalOf(t, err); code != codes.PermissionDenied || reason != backend.CodeScopeNotViaExecutor {
			t.Errorf("GetReceipt by %s = %v %s, want PermissionDenied %s", name, code, reason, backend.CodeScopeNotViaExecutor)
		}
	}
}

func TestRefusalOnTheWire(t *testing.T) {
	e := start(t, devConfig())
	tok := userToken(t, identity.MintRequest{User: "carol"})
	err := e.dial(backend.DefaultRelay).Invoke(relayedBy(t, tok, backend.InvocationIDHeader, "inv-9"), "/backendtest.Probe/Refuse", wrapperspb.String(""), new(wrapperspb.StringValue))
	code, stage, reason := refusalOf(t, err)
	if code != codes.FailedPrecondition || stage != backend.StageStateCheck || reason != "state.ticket_closed" {
		t.Fatalf("Refuse = %v %s/%s, want FailedPrecondition state_check/state.ticket_closed", code, stage, reason)
	}
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if ce, ok := d.(*mandatev1.CommandError); ok && (ce.GetInvocationId() != "inv-9" || ce.GetMessage() != "ticket T-1 is closed") {
			t.Errorf("CommandError = %v, want invocation inv-9 and the message", ce)
		}
	}
}

func TestAnotherRelay(t *testing.T) {
	cfg := devConfig()
	cfg.Relay = "gateway"
	e := start(t, cfg)
	tok := userToken(t, identity.MintRequest{User: "carol"})
	for service, want := range map[string]codes.Code{"gateway": codes.OK, backend.DefaultRelay: codes.PermissionDenied} {
		err := e.dial(service).Invoke(relayedBy(t, tok), "/backendtest.Probe/Who", wrapperspb.String(""), new(wrapperspb.StringValue))
		if code, _, _ := refusalOf(t, err); code != want {
			t.Errorf("relayed by %s: %v (%v), want %v", service, code, err, want)
		}
	}
}

func TestCallerFromWithoutTheGuard(t *testing.T) {
	_, err := backend.CallerFrom(context.Background())
	r, ok := backend.AsError(err)
	if !ok || r.Stage != backend.StageAuthenticate || r.Code != backend.CodeAuthenticationMissingCredentials {
		t.Fatalf("CallerFrom(no caller) = %v, want %s/%s", err, backend.StageAuthenticate, backend.CodeAuthenticationMissingCredentials)
	}
}

func TestNewValidates(t *testing.T) {
	ok := devConfig()
	tests := []struct {
		name   string
		change func(*backend.Config)
	}{
		{"no service secret", func(c *backend.Config) { c.ServiceSecret = nil }},
		{"a short service secret", func(c *backend.Config) { c.ServiceSecret = []byte("short") }},
		{"the service secret is the dev secret", func(c *backend.Config) { c.ServiceSecret = c.DevSecret }},
		{"no key of users' tokens", func(c *backend.Config) { c.DevSecret = nil }},
		{"no issuer", func(c *backend.Config) { c.Issuers = nil }},
		{"no audience", func(c *backend.Config) { c.Audience = nil }},
		{"a JWKS file that is not there", func(c *backend.Config) { c.DevSecret, c.JWKSFile = nil, "/nonexistent/jwks.json" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.change(&cfg)
			if _, err := backend.New(context.Background(), cfg); err == nil {
				t.Fatal("New accepted the config")
			}
		})
	}
	g, err := backend.New(context.Background(), ok)
	if err != nil || g.Relay() != "executor" {
		t.Fatalf("New(valid) = relay %v, %v; want executor", g, err)
	}
}
