package identity

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
)

// whoami is a tiny hand-written gRPC service that reports the principal it
// sees. With next set it relays the call to another server instead, which
// is how the on-behalf-of tests build a two-hop chain.
type whoami struct {
	next *grpc.ClientConn
}

const (
	whoamiGet   = "/mandate.test.Whoami/Get"
	whoamiWatch = "/mandate.test.Whoami/Watch"
)

// watchClientDesc describes Watch for clients; a separate value avoids an
// initialisation cycle with whoamiDesc, whose handler relays through it.
var watchClientDesc = grpc.StreamDesc{StreamName: "Watch", ServerStreams: true}

var whoamiDesc = grpc.ServiceDesc{
	ServiceName: "mandate.test.Whoami",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Get",
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) { return srv.(*whoami).get(ctx) }
			if ic == nil {
				return h(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: whoamiGet}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Watch",
		ServerStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			in := new(wrapperspb.StringValue)
			if err := ss.RecvMsg(in); err != nil {
				return err
			}
			return srv.(*whoami).watch(ss)
		},
	}},
}

func describe(ctx context.Context) string {
	p, ok := FromContext(ctx)
	if !ok {
		return "anonymous"
	}
	return fmt.Sprintf("kind=%s tenant=%s user=%s agent=%s model=%s via=%s service=%s",
		p.Kind, p.Tenant, p.UserID, p.AgentID, p.Model, p.Via, p.ServiceName)
}

// relayContext copies the incoming metadata to the outgoing call, the
// classic mistake that would forward the caller's credentials verbatim; the
// client interceptor must override it.
func relayContext(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	return metadata.NewOutgoingContext(ctx, md)
}

func (w *whoami) get(ctx context.Context) (*wrapperspb.StringValue, error) {
	if w.next == nil {
		return wrapperspb.String(describe(ctx)), nil
	}
	out := new(wrapperspb.StringValue)
	if err := w.next.Invoke(relayContext(ctx), whoamiGet, wrapperspb.String(""), out); err != nil {
		return nil, err
	}
	return out, nil
}

func (w *whoami) watch(ss grpc.ServerStream) error {
	if w.next == nil {
		return ss.SendMsg(wrapperspb.String(describe(ss.Context())))
	}
	cs, err := w.next.NewStream(relayContext(ss.Context()), &watchClientDesc, whoamiWatch)
	if err != nil {
		return err
	}
	if err := cs.SendMsg(wrapperspb.String("")); err != nil {
		return err
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	out := new(wrapperspb.StringValue)
	if err := cs.RecvMsg(out); err != nil {
		return err
	}
	return ss.SendMsg(out)
}

// startServer serves whoami and health on a loopback listener behind auth.
func startServer(t *testing.T, auth *Authenticator, impl *whoami) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(auth.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(auth.StreamServerInterceptor()),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	srv.RegisterService(&whoamiDesc, impl)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	must(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func withBearer(ctx context.Context, kv ...string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

func callGet(ctx context.Context, cc *grpc.ClientConn) (string, error) {
	out := new(wrapperspb.StringValue)
	err := cc.Invoke(ctx, whoamiGet, wrapperspb.String(""), out)
	return out.GetValue(), err
}

func callWatch(ctx context.Context, cc *grpc.ClientConn) (string, error) {
	cs, err := cc.NewStream(ctx, &watchClientDesc, whoamiWatch)
	if err != nil {
		return "", err
	}
	if err := cs.SendMsg(wrapperspb.String("")); err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	if err := cs.CloseSend(); err != nil {
		return "", err
	}
	out := new(wrapperspb.StringValue)
	if err := cs.RecvMsg(out); err != nil {
		return "", err
	}
	return out.GetValue(), nil
}

// assertRefusal checks the status code, the ErrorInfo reason and domain,
// and the CommandError detail of a refused call.
func assertRefusal(t *testing.T, err error, code string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unauthenticated {
		t.Fatalf("err = %v, want Unauthenticated", err)
	}
	var info *errdetails.ErrorInfo
	var cmdErr *mandatev1.CommandError
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *mandatev1.CommandError:
			cmdErr = d
		}
	}
	if info == nil || info.GetReason() != code || info.GetDomain() != ErrorDomain || info.GetMetadata()["stage"] != Stage {
		t.Errorf("ErrorInfo = %v, want reason %q domain %q", info, code, ErrorDomain)
	}
	if cmdErr == nil || cmdErr.GetCode() != code || cmdErr.GetStage() != Stage {
		t.Errorf("CommandError = %v, want code %q stage %q", cmdErr, code, Stage)
	}
}

type grpcFixture struct {
	users    *Verifier
	services *ServiceVerifier
	userTok  string
	agentTok string
	expired  string
	svcTok   string
}

func newGRPCFixture(t *testing.T) grpcFixture {
	t.Helper()
	f := grpcFixture{users: newTestVerifier(t, t.TempDir()), services: newTestServiceVerifier(t)}
	var err error
	f.userTok, err = MintDev(devSecret, MintRequest{Issuer: testIssuer, Audience: testAudience, User: "u-42", Tenant: testTenant, Now: testNow})
	must(t, err)
	f.agentTok, err = MintDev(devSecret, MintRequest{Issuer: testIssuer, Audience: testAudience, User: "u-42", Tenant: testTenant,
		Agent: "agent-7", Model: "claude-x", ModelVersion: "1", Now: testNow})
	must(t, err)
	f.expired, err = MintDev(devSecret, MintRequest{Issuer: testIssuer, Audience: testAudience, User: "u-42", Tenant: testTenant,
		TTL: time.Minute, Now: testNow.Add(-time.Hour)})
	must(t, err)
	f.svcTok, err = mintService(serviceSecret, testIssuer, testAudience, "gateway", time.Hour, testNow)
	must(t, err)
	return f
}

func (f grpcFixture) authenticator(t *testing.T, serviceOnly bool) *Authenticator {
	t.Helper()
	a, err := NewAuthenticator(AuthenticatorConfig{Users: f.users, Services: f.services, AllowServiceOnly: serviceOnly})
	must(t, err)
	return a
}

func TestServerInterceptors(t *testing.T) {
	f := newGRPCFixture(t)
	cc := dial(t, startServer(t, f.authenticator(t, false), &whoami{}))
	ccServiceOnly := dial(t, startServer(t, f.authenticator(t, true), &whoami{}))
	bearer := func(tok string) string { return "Bearer " + tok }
	const (
		userView    = "kind=user tenant=acme user=u-42 agent= model= via= service="
		agentView   = "kind=agent tenant=acme user=u-42 agent=agent-7 model=claude-x via= service="
		relayedView = "kind=user tenant=acme user=u-42 agent= model= via=gateway service="
	)

	tests := []struct {
		name string
		cc   *grpc.ClientConn
		md   []string
		code string // "" means success with want
		want string
	}{
		{"no credentials", cc, nil, failure.CodeAuthenticationMissingCredentials, ""},
		{"empty bearer", cc, []string{"authorization", "Bearer "}, failure.CodeAuthenticationMissingCredentials, ""},
		{"basic scheme", cc, []string{"authorization", "Basic dTpw"}, failure.CodeAuthenticationInvalidToken, ""},
		{"garbage token", cc, []string{"authorization", "Bearer garbage"}, failure.CodeAuthenticationInvalidToken, ""},
		{"two authorization values", cc, []string{"authorization", bearer(f.userTok), "authorization", bearer(f.userTok)}, failure.CodeAuthenticationInvalidToken, ""},
		{"expired user token", cc, []string{"authorization", bearer(f.expired)}, failure.CodeAuthenticationTokenExpired, ""},
		{"user token", cc, []string{"authorization", bearer(f.userTok)}, "", userView},
		{"lower-case scheme", cc, []string{"authorization", "bearer " + f.userTok}, "", userView},
		{"agent token", cc, []string{"authorization", bearer(f.agentTok)}, "", agentView},
		{"service token alone", cc, []string{"authorization", bearer(f.svcTok)}, failure.CodeAuthenticationInvalidToken, ""},
		{"service token alone where allowed", ccServiceOnly, []string{"authorization", bearer(f.svcTok)}, "",
			"kind=service tenant= user= agent= model= via= service=gateway"},
		{"service token on behalf of a user", cc, []string{"authorization", bearer(f.svcTok), OnBehalfOfHeader, bearer(f.userTok)}, "", relayedView},
		{"user token claiming to relay for a user", cc, []string{"authorization", bearer(f.userTok), OnBehalfOfHeader, bearer(f.userTok)}, failure.CodeAuthenticationNotAService, ""},
		{"agent token claiming to relay for a user", cc, []string{"authorization", bearer(f.agentTok), OnBehalfOfHeader, bearer(f.userTok)}, failure.CodeAuthenticationNotAService, ""},
		{"service token on behalf of an expired token", cc, []string{"authorization", bearer(f.svcTok), OnBehalfOfHeader, bearer(f.expired)}, failure.CodeAuthenticationTokenExpired, ""},
		{"service token on behalf of garbage", cc, []string{"authorization", bearer(f.svcTok), OnBehalfOfHeader, bearer("x.y.z")}, failure.CodeAuthenticationInvalidToken, ""},
		{"service token on behalf of another service", cc, []string{"authorization", bearer(f.svcTok), OnBehalfOfHeader, bearer(f.svcTok)}, failure.CodeAuthenticationInvalidToken, ""},
		{"on-behalf-of without authorization", cc, []string{OnBehalfOfHeader, bearer(f.userTok)}, failure.CodeAuthenticationMissingCredentials, ""},
	}
	for _, tc := range tests {
		for _, call := range []struct {
			kind string
			fn   func(context.Context, *grpc.ClientConn) (string, error)
		}{{"unary", callGet}, {"stream", callWatch}} {
			t.Run(tc.name+"/"+call.kind, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				got, err := call.fn(withBearer(ctx, tc.md...), tc.cc)
				if tc.code != "" {
					assertRefusal(t, err, tc.code)
					return
				}
				if err != nil {
					t.Fatalf("call: %v", err)
				}
				if got != tc.want {
					t.Errorf("principal view = %q\nwant             %q", got, tc.want)
				}
			})
		}
	}
}

func TestHealthIsUnauthenticated(t *testing.T) {
	f := newGRPCFixture(t)
	cc := dial(t, startServer(t, f.authenticator(t, false), &whoami{}))
	client := healthpb.NewHealthClient(cc)
	tests := []struct {
		name string
		call func(ctx context.Context) (healthpb.HealthCheckResponse_ServingStatus, error)
	}{
		{"Check", func(ctx context.Context) (healthpb.HealthCheckResponse_ServingStatus, error) {
			r, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			return r.GetStatus(), err
		}},
		{"Watch (stream)", func(ctx context.Context) (healthpb.HealthCheckResponse_ServingStatus, error) {
			s, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				return 0, err
			}
			r, err := s.Recv()
			return r.GetStatus(), err
		}},
		{"Check with a garbage token is still answered", func(ctx context.Context) (healthpb.HealthCheckResponse_ServingStatus, error) {
			r, err := client.Check(withBearer(ctx, "authorization", "Bearer junk"), &healthpb.HealthCheckRequest{})
			return r.GetStatus(), err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			got, err := tc.call(ctx)
			if err != nil || got != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("status = %v, err = %v; want SERVING", got, err)
			}
		})
	}
}

// TestOnBehalfOfPropagation runs client → frontend → backend on two real
// servers. The frontend authenticates the end user; its outgoing calls carry
// the frontend's service token plus the end user's original token, and the
// backend must see the end user with Via = "frontend".
func TestOnBehalfOfPropagation(t *testing.T) {
	f := newGRPCFixture(t)
	backendAddr := startServer(t, f.authenticator(t, false), &whoami{})

	src, err := NewServiceTokenSource(serviceSecret, testIssuer, testAudience, "frontend", time.Hour)
	must(t, err)
	src.now, src.token = fixedNow, "" // mint on the verifiers' clock
	toBackend := dial(t, backendAddr,
		grpc.WithUnaryInterceptor(UnaryClientInterceptor(src)),
		grpc.WithStreamInterceptor(StreamClientInterceptor(src)),
	)
	frontendUsersOnly, err := NewAuthenticator(AuthenticatorConfig{Users: f.users})
	must(t, err)
	frontend := dial(t, startServer(t, frontendUsersOnly, &whoami{next: toBackend}))

	tests := []struct {
		name string
		cc   *grpc.ClientConn
		md   []string
		code string
		want string
	}{
		{"user through frontend", frontend, []string{"authorization", "Bearer " + f.userTok}, "",
			"kind=user tenant=acme user=u-42 agent= model= via=frontend service="},
		{"agent through frontend", frontend, []string{"authorization", "Bearer " + f.agentTok}, "",
			"kind=agent tenant=acme user=u-42 agent=agent-7 model=claude-x via=frontend service="},
		{"frontend refuses before relaying", frontend, []string{"authorization", "Bearer " + f.expired}, failure.CodeAuthenticationTokenExpired, ""},
		{"frontend refuses on-behalf-of calls (no service verifier)", frontend,
			[]string{"authorization", "Bearer " + f.svcTok, OnBehalfOfHeader, "Bearer " + f.userTok}, failure.CodeAuthenticationNotAService, ""},
		// Directly through the interceptor without an end user: only the
		// service token is sent, and the backend does not accept services
		// on their own.
		{"service call without an end user", toBackend, nil, failure.CodeAuthenticationInvalidToken, ""},
	}
	for _, tc := range tests {
		for _, call := range []struct {
			kind string
			fn   func(context.Context, *grpc.ClientConn) (string, error)
		}{{"unary", callGet}, {"stream", callWatch}} {
			t.Run(tc.name+"/"+call.kind, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				got, err := call.fn(withBearer(ctx, tc.md...), tc.cc)
				if tc.code != "" {
					assertRefusal(t, err, tc.code)
					return
				}
				if err != nil {
					t.Fatalf("call: %v", err)
				}
				if got != tc.want {
					t.Errorf("backend saw %q\nwant        %q", got, tc.want)
				}
			})
		}
	}
}

// failingSource stands in for a service whose token cannot be minted.
type failingSource struct{}

func (failingSource) Token(context.Context) (string, error) { return "", errors.New("no token") }

func TestClientInterceptorFailsWithoutToken(t *testing.T) {
	f := newGRPCFixture(t)
	cc := dial(t, startServer(t, f.authenticator(t, false), &whoami{}),
		grpc.WithUnaryInterceptor(UnaryClientInterceptor(failingSource{})),
		grpc.WithStreamInterceptor(StreamClientInterceptor(failingSource{})),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, fn := range map[string]func(context.Context, *grpc.ClientConn) (string, error){"unary": callGet, "stream": callWatch} {
		if _, err := fn(ctx, cc); err == nil || err.Error() != "no token" {
			t.Errorf("%s: err = %v, want the token source's error", name, err)
		}
	}
}

// rotatingSource hands out whichever token it was last set to.
type rotatingSource struct{ tok string }

func (s *rotatingSource) Token(context.Context) (string, error) { return s.tok, nil }

// TestClientInterceptorFollowsTokenRotation: the authorization header an
// outgoing call carries is the source's current token, also after the
// source moves to a new one.
func TestClientInterceptorFollowsTokenRotation(t *testing.T) {
	src := &rotatingSource{tok: "first"}
	icpt := UnaryClientInterceptor(src)
	sent := func() []string {
		var got []string
		err := icpt(context.Background(), "/x.Y/Z", nil, nil, nil,
			func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
				md, _ := metadata.FromOutgoingContext(ctx)
				got = md.Get("authorization")
				return nil
			})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, tok := range []string{"first", "first", "second", "first"} {
		src.tok = tok
		if got := sent(); len(got) != 1 || got[0] != "Bearer "+tok {
			t.Fatalf("token %q: authorization %q", tok, got)
		}
	}
}

// TestClientInterceptorReplacesCredentials: credentials already in the
// outgoing metadata (e.g. copied from an incoming call, in any case) are
// replaced by the service's token and the forwarded user's, other keys
// pass through, and the caller's metadata is left as it was.
func TestClientInterceptorReplacesCredentials(t *testing.T) {
	icpt := UnaryClientInterceptor(&rotatingSource{tok: "svc"})
	callerMD := metadata.MD{"Authorization": {"Bearer smuggled"}, OnBehalfOfHeader: {"Bearer smuggled"}, "x-keep": {"1"}}
	ctx := metadata.AppendToOutgoingContext(metadata.NewOutgoingContext(context.Background(), callerMD), "x-added", "2")
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want metadata.MD
	}{
		{"no user", ctx, metadata.MD{"authorization": {"Bearer svc"}, "x-keep": {"1"}, "x-added": {"2"}}},
		{"forwarding a user", WithRawToken(ctx, "user"),
			metadata.MD{"authorization": {"Bearer svc"}, OnBehalfOfHeader: {"Bearer user"}, "x-keep": {"1"}, "x-added": {"2"}}},
		{"no metadata", context.Background(), metadata.MD{"authorization": {"Bearer svc"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got metadata.MD
			err := icpt(tc.ctx, "/x.Y/Z", nil, nil, nil,
				func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
					got, _ = metadata.FromOutgoingContext(ctx)
					return nil
				})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("sent %v, want %v", got, tc.want)
			}
		})
	}
	if want := (metadata.MD{"Authorization": {"Bearer smuggled"}, OnBehalfOfHeader: {"Bearer smuggled"}, "x-keep": {"1"}}); !reflect.DeepEqual(callerMD, want) {
		t.Errorf("the caller's metadata became %v", callerMD)
	}
}

// TestClientInterceptorSetsHeaders: the headers an interceptor is made
// with are set on every outgoing call, unary or stream, replacing a value
// the context carries (a relayed call's), with the credentials; the
// caller's metadata is left as it was.
func TestClientInterceptorSetsHeaders(t *testing.T) {
	set := Header{Key: "x-digest", Value: "own"}
	callerMD := metadata.MD{"x-digest": {"relayed"}, "x-keep": {"1"}}
	ctx := WithRawToken(metadata.NewOutgoingContext(context.Background(), callerMD), "user")
	want := metadata.MD{"authorization": {"Bearer svc"}, OnBehalfOfHeader: {"Bearer user"}, "x-keep": {"1"}, "x-digest": {"own"}}
	var unary, stream metadata.MD
	err := UnaryClientInterceptor(&rotatingSource{tok: "svc"}, set)(ctx, "/x.Y/Z", nil, nil, nil,
		func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			unary, _ = metadata.FromOutgoingContext(ctx)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	_, err = StreamClientInterceptor(&rotatingSource{tok: "svc"}, set)(ctx, nil, nil, "/x.Y/W",
		func(ctx context.Context, _ *grpc.StreamDesc, _ *grpc.ClientConn, _ string, _ ...grpc.CallOption) (grpc.ClientStream, error) {
			stream, _ = metadata.FromOutgoingContext(ctx)
			return nil, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(unary, want) || !reflect.DeepEqual(stream, want) {
		t.Errorf("sent %v (unary) and %v (stream), want %v", unary, stream, want)
	}
	if !reflect.DeepEqual(callerMD, metadata.MD{"x-digest": {"relayed"}, "x-keep": {"1"}}) {
		t.Errorf("the caller's metadata became %v", callerMD)
	}
}
