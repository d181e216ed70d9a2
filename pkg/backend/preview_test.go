package backend_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/pkg/backend"
)

// previewOf is a command's preview, over a request type the module has (GetReceiptRequest
// stands in for a backend's own).
func previewOf(effects []backend.Effect, err error) *backend.Previews {
	p := backend.NewPreviews(func(context.Context) (backend.Caller, error) {
		return backend.Caller{Tenant: "acme", UserID: "carol", InvocationID: "inv-1"}, nil
	})
	backend.HandlePreview(p, "/x.v1.X/Do", func(_ context.Context, c backend.Caller, req *mandatev1.GetReceiptRequest) ([]backend.Effect, error) {
		if c.UserID != "carol" || req.GetInvocationId() != "the request" {
			return nil, errors.New("the preview was not given its caller and request")
		}
		return effects, err
	})
	return p
}

func ask(t *testing.T, p *backend.Previews, method string) (*mandatev1.PreviewResponse, error) {
	t.Helper()
	wire, err := proto.Marshal(&mandatev1.GetReceiptRequest{InvocationId: "the request"})
	if err != nil {
		t.Fatal(err)
	}
	return p.Preview(context.Background(), &mandatev1.PreviewRequest{Method: method, Request: wire, InvocationId: "inv-1"})
}

// TestPreviewsAllowed: the effect lines come back with their amounts and a digest that
// changes with them.
func TestPreviewsAllowed(t *testing.T) {
	line := backend.Effect{Kind: "refund", Text: "refund 25.00 EUR of 49.90 EUR paid; 0.00 EUR refunded so far",
		Amounts: []backend.Amount{{Label: "refund", Currency: "EUR", Minor: 2500}}}
	resp, err := ask(t, previewOf([]backend.Effect{line}, nil), "/x.v1.X/Do")
	if err != nil {
		t.Fatal(err)
	}
	a := resp.GetAllowed()
	if len(a.GetEffects()) != 1 || a.GetEffects()[0].GetText() != line.Text || a.GetEffects()[0].GetAmounts()[0].GetAmountMinor() != 2500 || len(a.GetDigest()) != 64 {
		t.Fatalf("allowed: %v", resp)
	}
	other := line
	other.Amounts = []backend.Amount{{Label: "refund", Currency: "EUR", Minor: 2400}}
	resp2, _ := ask(t, previewOf([]backend.Effect{other}, nil), "/x.v1.X/Do")
	if resp2.GetAllowed().GetDigest() == a.GetDigest() {
		t.Fatal("two previews of different amounts share a digest")
	}
}

// TestPreviewsRefusal: a refusal — a *Error, or the status a handler returns — is the
// answer, with its stage, code, gRPC code and the caller's invocation; a fault is an error
// status, its text never sent.
func TestPreviewsRefusal(t *testing.T) {
	notFound := backend.Refuse(backend.StageStateCheck, "state.not_found", "ticket T-9 does not exist")
	notFound.Status = codes.NotFound
	for name, err := range map[string]error{"an *Error": notFound, "a status": notFound.GRPCStatus().Err()} {
		resp, rerr := ask(t, previewOf(nil, err), "/x.v1.X/Do")
		r := resp.GetRefusal()
		if rerr != nil || r.GetError().GetStage() != "state_check" || r.GetError().GetCode() != "state.not_found" ||
			codes.Code(r.GetGrpcCode()) != codes.NotFound || r.GetError().GetInvocationId() != "inv-1" || r.GetError().GetMessage() != notFound.Message {
			t.Fatalf("%s: %v %v", name, resp, rerr)
		}
	}
	domain, _ := ask(t, previewOf(nil, backend.Refuse(backend.StagePreInvariant, "refund.exceeds_paid", "too much")), "/x.v1.X/Do")
	if codes.Code(domain.GetRefusal().GetGrpcCode()) != codes.FailedPrecondition {
		t.Fatalf("a domain code without a status: %v", domain)
	}
	_, err := ask(t, previewOf(nil, errors.New("db: connection refused at 10.0.0.7")), "/x.v1.X/Do")
	if status.Code(err) != codes.Internal || strings.Contains(err.Error(), "10.0.0.7") {
		t.Fatalf("a fault: %v", err)
	}
}

// TestPreviewsBounds: a method without a preview is Unimplemented; effect lines that break
// the contract are the backend's fault (Internal), not sent; a request that does not decode
// is refused at schema_validate.
func TestPreviewsBounds(t *testing.T) {
	if _, err := ask(t, previewOf(nil, nil), "/x.v1.X/Other"); status.Code(err) != codes.Unimplemented {
		t.Fatalf("another method: %v", err)
	}
	for name, effects := range map[string][]backend.Effect{
		"an empty line":  {{Text: ""}},
		"two lines":      {{Text: "one\ntwo"}},
		"a long line":    {{Text: strings.Repeat("x", backend.MaxEffectText+1)}},
		"a bad kind":     {{Kind: "Refund!", Text: "x"}},
		"a bad currency": {{Text: "x", Amounts: []backend.Amount{{Currency: "eur"}}}},
		"too many lines": make([]backend.Effect, backend.MaxEffects+1),
	} {
		if _, err := ask(t, previewOf(effects, nil), "/x.v1.X/Do"); status.Code(err) != codes.Internal {
			t.Errorf("%s: %v", name, err)
		}
	}
	p := previewOf(nil, nil)
	resp, err := p.Preview(context.Background(), &mandatev1.PreviewRequest{Method: "/x.v1.X/Do", Request: []byte{0xff}, InvocationId: "inv-1"})
	if err != nil || resp.GetRefusal().GetError().GetCode() != backend.CodeSchemaInvalid || codes.Code(resp.GetRefusal().GetGrpcCode()) != codes.InvalidArgument {
		t.Fatalf("an undecodable request: %v %v", resp, err)
	}
}
