package executor_test

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/internal/schema"
	"github.com/mandate-dev/mandate/internal/schema/schematest"
	"github.com/mandate-dev/mandate/services/executor"
)

// TestDecodeReply checks how the dispatcher reads a backend's reply: a
// search result transcoded to the JSON its decoding would give, never
// decoded; a reply of a type it does not transcode decoded as before; and
// a reply that does not decode, or on which the decoder panics, failing
// with the status gRPC's codec gave it (codes.Internal).
func TestDecodeReply(t *testing.T) {
	resp := &helpdeskv1.SearchTicketsResponse{NextPageToken: "next", Tickets: []*helpdeskv1.Ticket{{
		TicketId: "T-1", Subject: "refund \"now\"", Tags: []string{"billing"}, CreatedAt: timestamppb.New(timestamppb.Now().AsTime()),
	}}}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	md := resp.ProtoReflect().Descriptor()
	r, err := executor.DecodeReply(md, b)
	if err != nil {
		t.Fatal(err)
	}
	decoded := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(b, decoded); err != nil {
		t.Fatal(err)
	}
	want, err := schema.MarshalOutput(decoded)
	if err != nil {
		t.Fatal(err)
	}
	if r.Message != nil || !bytes.Equal(r.JSON, want) || !bytes.Equal(r.Wire, b) {
		t.Errorf("search result: message %v, JSON %s, want no message and %s and the wire bytes", r.Message, r.JSON, want)
	}

	s, err := structpb.NewStruct(map[string]any{"a": 1.5})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := proto.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	r, err = executor.DecodeReply(s.ProtoReflect().Descriptor(), sb)
	if err != nil || r.Message == nil || r.JSON != nil || !proto.Equal(r.Message, s) {
		t.Errorf("a Struct, which protojson encodes: %+v, %v; want it decoded", r, err)
	}

	if _, err := executor.DecodeReply(md, b[:len(b)-1]); status.Code(err) != codes.Internal {
		t.Errorf("truncated: %v, want codes.Internal", err)
	}
	pmd, panicking := schematest.PanickingMap(t)
	if _, err := executor.DecodeReply(pmd, panicking); status.Code(err) != codes.Internal {
		t.Errorf("a map entry the decoder panics on: %v, want codes.Internal", err)
	}
}
