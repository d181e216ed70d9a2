package server

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// decodeGuard is gRPC's protobuf codec with one difference: a message that
// makes the protobuf runtime panic while decoding is an error, as any other
// malformed message is, not a panic. protobuf-go v1.36.12 panics ("cannot
// convert nil to map key") on a map entry whose integer key arrives with the
// wrong wire type when it decodes into a dynamic message, which is what the
// executor decodes its backends' answers and its governed proxy's requests
// into; a backend or a caller could otherwise crash the call mid-pipeline,
// after its intent was written and before its outcome. The codec is
// registered for every gRPC connection and server of a process that links
// this package.
type decodeGuard struct{ encoding.CodecV2 }

func (c decodeGuard) Unmarshal(data mem.BufferSlice, v any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed %T: %v", v, r)
		}
	}()
	return c.CodecV2.Unmarshal(data, v)
}

func init() {
	encoding.RegisterCodecV2(decodeGuard{encoding.GetCodecV2(proto.Name)})
}
