package executor_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/internal/manifest"
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

// wireConn is a backend connection that keeps what gRPC would send: the
// request as the call's codec encodes it.
type wireConn struct {
	sent  []byte
	reply []byte
}

func (c *wireConn) Invoke(_ context.Context, _ string, args, reply any, opts ...grpc.CallOption) error {
	var codec encoding.CodecV2
	for _, o := range opts {
		if f, ok := o.(grpc.ForceCodecV2CallOption); ok {
			codec = f.CodecV2
		}
	}
	if codec == nil {
		return errors.New("no codec forced")
	}
	data, err := codec.Marshal(args)
	if err != nil {
		return err
	}
	c.sent = data.Materialize()
	return codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(c.reply)}, reply)
}

func (*wireConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("no streams")
}

// TestDispatchSendsTheWireBytes: a dispatch that carries its request's
// wire bytes (the arguments' canonical bytes) sends those, not the message
// encoded again; one without sends the message as gRPC's codec encodes it.
func TestDispatchSendsTheWireBytes(t *testing.T) {
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	cmd, _ := set.ByCode("ticket.search")
	md, _ := set.Method("ticket.search")
	req := &helpdeskv1.SearchTicketsRequest{Query: "charged twice"}
	reply, err := proto.Marshal(&helpdeskv1.SearchTicketsResponse{NextPageToken: "n"})
	if err != nil {
		t.Fatal(err)
	}
	encoded, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	// Bytes no encoder of req would make (a field repeated, the last one
	// wins), to tell them apart from an encoding of the message.
	wire := append(append([]byte{}, encoded...), encoded...)
	for _, tc := range []struct {
		name string
		wire []byte
		want []byte
	}{{"with its wire bytes", wire, wire}, {"without", nil, encoded}} {
		t.Run(tc.name, func(t *testing.T) {
			conn := &wireConn{reply: reply}
			d := executor.NewGRPCDispatcher(map[string]grpc.ClientConnInterface{cmd.RPC.Service: conn})
			r, err := d.Dispatch(t.Context(), executor.Dispatch{Command: cmd, Method: md, Request: req, Wire: tc.wire, InvocationID: "inv-1", Deadline: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(conn.sent, tc.want) {
				t.Errorf("sent %x, want %x", conn.sent, tc.want)
			}
			if !bytes.Contains(r.JSON, []byte(`"next_page_token":"n"`)) {
				t.Errorf("reply %s", r.JSON)
			}
		})
	}
}
