package executor

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// previewBackend is a backend's PreviewService that records the invocation id the executor
// sent in the metadata.
type previewBackend struct {
	mandatev1.UnimplementedPreviewServiceServer
	sent chan string
}

func (b *previewBackend) Preview(ctx context.Context, req *mandatev1.PreviewRequest) (*mandatev1.PreviewResponse, error) {
	b.sent <- strings.Join(metadata.ValueFromIncomingContext(ctx, MetadataInvocationID), ",") + "|" + req.GetInvocationId() + "|" + req.GetMethod()
	return &mandatev1.PreviewResponse{Verdict: &mandatev1.PreviewResponse_Allowed{Allowed: &mandatev1.PreviewAllowed{
		Effects: []*mandatev1.EffectLine{{Kind: "refund", Text: "refund 1.00 EUR"}},
	}}}, nil
}

// loopback serves register's services on a loopback port and returns a connection to it.
func loopback(t *testing.T, register func(*grpc.Server)) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestGRPCDispatcherPreview: a backend that serves no PreviewService is ErrNoPreview (gRPC's
// Unimplemented for an unknown service), and so is a service without a backend; one that
// serves it gets the call's method, request and invocation id, in the request and in the
// metadata, as a dispatch carries it.
func TestGRPCDispatcherPreview(t *testing.T) {
	cmd := &manifest.Command{RPC: manifest.RPC{Service: "x.v1.X", FullMethod: "/x.v1.X/Do"}}
	d := Dispatch{Command: cmd, InvocationID: "inv-1", Deadline: 5 * time.Second}
	ctx := context.Background()

	none := NewGRPCDispatcher(map[string]grpc.ClientConnInterface{"x.v1.X": loopback(t, func(*grpc.Server) {})})
	if _, err := none.Preview(ctx, d, nil); !errors.Is(err, ErrNoPreview) {
		t.Fatalf("a backend without previews: %v", err)
	}
	if _, err := NewGRPCDispatcher(nil).Preview(ctx, d, nil); !errors.Is(err, ErrNoPreview) {
		t.Fatalf("no backend: %v", err)
	}

	b := &previewBackend{sent: make(chan string, 1)}
	with := NewGRPCDispatcher(map[string]grpc.ClientConnInterface{"x.v1.X": loopback(t, func(s *grpc.Server) { mandatev1.RegisterPreviewServiceServer(s, b) })})
	resp, err := with.Preview(ctx, d, []byte{0x0a, 0x01, 'x'})
	if err != nil || resp.GetAllowed().GetEffects()[0].GetText() != "refund 1.00 EUR" {
		t.Fatalf("a backend with previews: %v %v", resp, err)
	}
	if got := <-b.sent; got != "inv-1|inv-1|/x.v1.X/Do" {
		t.Fatalf("the backend was sent %q", got)
	}
}

// TestPreviewAnswersTheExecutorReads: a refusal is the one dispatch would report (the
// backend's stage and code with its gRPC code; a code a dispatch would not keep is no
// refusal), and an allowed preview beyond the contract's bounds is set aside.
func TestPreviewAnswersTheExecutorReads(t *testing.T) {
	refusal := func(stage, code string, c codes.Code) *mandatev1.PreviewRefusal {
		return &mandatev1.PreviewRefusal{Error: &mandatev1.CommandError{Stage: stage, Code: code, Message: "m"}, GrpcCode: uint32(c)}
	}
	if fe, ok := previewRefusal(refusal("state_check", "state.not_found", codes.NotFound)); !ok || fe.Stage != "state_check" || fe.Code != "state.not_found" || fe.Status != codes.NotFound {
		t.Fatalf("state.not_found: %+v %v", fe, ok)
	}
	if fe, ok := previewRefusal(refusal("somewhere", "order.shipped", codes.FailedPrecondition)); !ok || fe.Stage != StageDispatch || fe.Code != "order.shipped" {
		t.Fatalf("a domain code at another stage is kept, at dispatch: %+v %v", fe, ok)
	}
	for name, r := range map[string]*mandatev1.PreviewRefusal{
		"no gRPC code":      refusal("state_check", "state.not_found", codes.OK),
		"an unknown code":   refusal("state_check", "state.not_found", 99),
		"no code":           refusal("state_check", "", codes.NotFound),
		"a fault":           refusal("dispatch", "internal.error", codes.Internal),
		"unavailable":       refusal("dispatch", "helpdesk.unavailable", codes.Unavailable),
		"no error at all":   {GrpcCode: uint32(codes.NotFound)},
		"an unknown status": refusal("dispatch", "x.y", codes.Unknown),
	} {
		if fe, ok := previewRefusal(r); ok {
			t.Errorf("%s: read as the refusal %+v", name, fe)
		}
	}
	line := func(text string) *mandatev1.EffectLine { return &mandatev1.EffectLine{Text: text} }
	if p := checkPreview(&mandatev1.PreviewAllowed{Effects: []*mandatev1.EffectLine{line("refund 1.00 EUR")}}); p != "" {
		t.Fatalf("a good preview: %s", p)
	}
	for name, a := range map[string]*mandatev1.PreviewAllowed{
		"an empty line":  {Effects: []*mandatev1.EffectLine{line("")}},
		"a long line":    {Effects: []*mandatev1.EffectLine{line(strings.Repeat("x", maxEffectText+1))}},
		"not UTF-8":      {Effects: []*mandatev1.EffectLine{line("\xff")}},
		"too many lines": {Effects: make([]*mandatev1.EffectLine, maxPreviewEffects+1)},
		"a long digest":  {Digest: strings.Repeat("a", 65)},
	} {
		if checkPreview(a) == "" {
			t.Errorf("%s: accepted", name)
		}
	}
	a := &mandatev1.PreviewAllowed{Effects: []*mandatev1.EffectLine{line("refund 1.00 EUR")}}
	b := &mandatev1.PreviewAllowed{Effects: []*mandatev1.EffectLine{line("refund 2.00 EUR")}}
	if previewDigest("/x.v1.X/Do", a) == previewDigest("/x.v1.X/Do", b) || previewDigest("/x.v1.X/Do", a) == previewDigest("/x.v1.X/Other", a) ||
		len(previewDigest("/x.v1.X/Do", a)) != 64 {
		t.Fatal("the preview digest does not tell the previews apart")
	}
}
