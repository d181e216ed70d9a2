package server_test

import (
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/mandate-dev/mandate/internal/schema/schematest"
	_ "github.com/mandate-dev/mandate/internal/server" // registers the guarded codec
)

// A message on which the protobuf runtime panics is, for gRPC, a message it
// cannot decode: an error for the RPC, not a crash of the call.
func TestCodecRefusesWhatPanics(t *testing.T) {
	md, b := schematest.PanickingMap(t)
	func() {
		defer func() { _ = recover() }()
		_ = proto.Unmarshal(b, dynamicpb.NewMessage(md))
		t.Skip("the protobuf runtime no longer panics on this input; the guard has nothing to catch")
	}()
	codec := encoding.GetCodecV2("proto")
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, dynamicpb.NewMessage(md)); err == nil {
		t.Fatal("the proto codec accepted a message the runtime cannot decode")
	}
	ok, _ := codec.Marshal(dynamicpb.NewMessage(md))
	if err := codec.Unmarshal(ok, dynamicpb.NewMessage(md)); err != nil {
		t.Fatalf("a well-formed message: %v", err)
	}
}
