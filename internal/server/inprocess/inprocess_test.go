package inprocess_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/identity"
	"github.com/mandate-dev/mandate/internal/server"
	"github.com/mandate-dev/mandate/internal/server/inprocess"
)

var devSecret = []byte("dev-secret-0123456789abcdef0123456789")

// mint is a user token the test servers accept.
func mint(t *testing.T) string {
	t.Helper()
	tok, err := identity.MintDev(devSecret, identity.MintRequest{Issuer: "test", Audience: "mandate", User: "olive", Tenant: "acme", TTL: time.Hour, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// newServer is a server that authenticates the tokens of mint.
func newServer(t *testing.T, name string) *server.Server {
	t.Helper()
	users, err := identity.NewVerifier(t.Context(), identity.Config{Audience: []string{"mandate"}, Issuers: []string{"test"}, DevSecret: devSecret})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := identity.NewAuthenticator(identity.AuthenticatorConfig{Users: users})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Name: name, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// whoAudit answers Verify with the caller it was given.
type whoAudit struct {
	mandatev1.UnimplementedAuditServiceServer
}

func (whoAudit) Verify(ctx context.Context, _ *mandatev1.VerifyRequest) (*mandatev1.VerifyResponse, error) {
	p, ok := identity.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no principal")
	}
	// The principal travels back in the status: Verify has no field for it.
	return nil, status.Error(codes.FailedPrecondition, p.UserID+"@"+p.Tenant)
}

// TestInProcessRunsTheServerInterceptors: a call on the in-process channel
// is authenticated like a gRPC call — refused without a token, served with
// the caller's principal with one — and reaches only services registered
// through the Server.
func TestInProcessRunsTheServerInterceptors(t *testing.T) {
	ctx := context.Background()
	srv := newServer(t, "audit")
	mandatev1.RegisterAuditServiceServer(srv, whoAudit{})
	client := mandatev1.NewAuditServiceClient(inprocess.Conn(srv, nil))

	_, err := client.Verify(ctx, &mandatev1.VerifyRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("without a token: %v, want Unauthenticated", err)
	}
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+mint(t))
	_, err = client.Verify(authed, &mandatev1.VerifyRequest{})
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition || st.Message() != "olive@acme" {
		t.Fatalf("with a token: %v, want the handler to see olive@acme", err)
	}
	_, err = mandatev1.NewConfirmServiceClient(inprocess.Conn(srv, nil)).Get(authed, &mandatev1.ConfirmServiceGetRequest{ChallengeId: "x"})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("unregistered service: %v, want Unimplemented", err)
	}
}

// digestAudit answers Verify with the x-digest header it was sent.
type digestAudit struct {
	mandatev1.UnimplementedAuditServiceServer
}

func (digestAudit) Verify(ctx context.Context, _ *mandatev1.VerifyRequest) (*mandatev1.VerifyResponse, error) {
	p, _ := identity.FromContext(ctx)
	return nil, status.Error(codes.FailedPrecondition, p.UserID+" "+strings.Join(metadata.ValueFromIncomingContext(ctx, "x-digest"), ","))
}

// tokenOf is a TokenSource of one token.
type tokenOf string

func (t tokenOf) Token(context.Context) (string, error) { return string(t), nil }

// TestConnSendsHeadersWithTheCredential: the headers a connection is made
// with reach the service with the caller's credential, replacing a value
// the caller's context carries.
func TestConnSendsHeadersWithTheCredential(t *testing.T) {
	srv := newServer(t, "audit")
	mandatev1.RegisterAuditServiceServer(srv, digestAudit{})
	client := mandatev1.NewAuditServiceClient(inprocess.Conn(srv, tokenOf(mint(t)), identity.Header{Key: "x-digest", Value: "own"}))
	relayed := metadata.AppendToOutgoingContext(context.Background(), "x-digest", "relayed")
	_, err := client.Verify(relayed, &mandatev1.VerifyRequest{})
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition || st.Message() != "olive own" {
		t.Fatalf("%v, want the handler to see olive and the digest own", err)
	}
}

// echoConfirm answers Get with a challenge of the id it was asked for.
type echoConfirm struct {
	mandatev1.UnimplementedConfirmServiceServer
}

func (echoConfirm) Get(_ context.Context, req *mandatev1.ConfirmServiceGetRequest) (*mandatev1.Challenge, error) {
	return &mandatev1.Challenge{ChallengeId: req.GetChallengeId()}, nil
}

// TestInProcessCarriesDynamicMessages: a caller that speaks dynamic
// messages built from descriptors of its own — the executor's dispatcher,
// from the manifest's descriptor set — reaches a service serving the
// generated types, both ways, as over a gRPC connection.
func TestInProcessCarriesDynamicMessages(t *testing.T) {
	ctx := context.Background()
	srv := newServer(t, "confirm")
	mandatev1.RegisterConfirmServiceServer(srv, echoConfirm{})
	// Descriptors of the caller's own, distinct from the generated ones.
	fdp := protodesc.ToFileDescriptorProto(mandatev1.File_mandate_v1_confirm_proto)
	file, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	reqDesc := file.Messages().ByName("ConfirmServiceGetRequest")
	respDesc := file.Messages().ByName("Challenge")
	if reqDesc == (&mandatev1.ConfirmServiceGetRequest{}).ProtoReflect().Descriptor() {
		t.Fatal("the test's descriptors are the generated ones")
	}
	req := dynamicpb.NewMessage(reqDesc)
	req.Set(reqDesc.Fields().ByName("challenge_id"), protoreflect.ValueOfString("ch-1"))
	resp := dynamicpb.NewMessage(respDesc)
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+mint(t))
	if err := inprocess.Conn(srv, nil).Invoke(authed, mandatev1.ConfirmService_Get_FullMethodName, req, resp); err != nil {
		t.Fatal(err)
	}
	if got := resp.Get(respDesc.Fields().ByName("challenge_id")).String(); got != "ch-1" {
		t.Fatalf("challenge_id %q, want ch-1", got)
	}
	// A message of another type is refused, not mangled.
	other := dynamicpb.NewMessage(respDesc)
	if err := inprocess.Conn(srv, nil).Invoke(authed, mandatev1.ConfirmService_Get_FullMethodName, other, resp); err == nil {
		t.Fatal("a Challenge was accepted as a ConfirmServiceGetRequest")
	}
}

// wireBytes is a request its caller already encoded, as the executor's
// dispatcher sends the arguments' canonical bytes.
type wireBytes []byte

func (b wireBytes) MarshalBinary() ([]byte, error) { return b, nil }

// TestInProcessCarriesWireBytes: a request that is wire bytes
// (encoding.BinaryMarshaler) reaches the service decoded from them, as
// over a gRPC connection.
func TestInProcessCarriesWireBytes(t *testing.T) {
	srv := newServer(t, "confirm")
	mandatev1.RegisterConfirmServiceServer(srv, echoConfirm{})
	b, err := proto.Marshal(&mandatev1.ConfirmServiceGetRequest{ChallengeId: "ch-2"})
	if err != nil {
		t.Fatal(err)
	}
	var resp mandatev1.Challenge
	authed := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+mint(t))
	if err := inprocess.Conn(srv, nil).Invoke(authed, mandatev1.ConfirmService_Get_FullMethodName, wireBytes(b), &resp); err != nil {
		t.Fatal(err)
	}
	if resp.GetChallengeId() != "ch-2" {
		t.Fatalf("challenge_id %q, want ch-2", resp.GetChallengeId())
	}
}

// TestConnServesServicesRegisteredLater: a connection taken before a
// service is registered reaches it once it is, as mandate dev takes the
// bridge's connection before the bridge registers on the same server.
func TestConnServesServicesRegisteredLater(t *testing.T) {
	srv := newServer(t, "confirm")
	conn := inprocess.Conn(srv, nil)
	mandatev1.RegisterConfirmServiceServer(srv, echoConfirm{})
	authed := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+mint(t))
	got, err := mandatev1.NewConfirmServiceClient(conn).Get(authed, &mandatev1.ConfirmServiceGetRequest{ChallengeId: "ch-2"})
	if err != nil || got.GetChallengeId() != "ch-2" {
		t.Fatalf("Get = %v, %v; want challenge ch-2", got, err)
	}
}
