package executor

import (
	"google.golang.org/genproto/googleapis/rpc/status"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/schema"
)

// outputJSON is how results are encoded everywhere: proto field names, so
// outputs read like inputs.
var outputJSON = protojson.MarshalOptions{UseProtoNames: true}

func marshalOutput(m proto.Message) ([]byte, error) {
	if m == nil {
		return []byte("{}"), nil
	}
	opts := outputJSON
	// The required-field check always passes on a type that cannot lack
	// one, and on a dynamic message it allocates as it walks every field.
	opts.AllowPartial = !schema.CanLackRequired(m.ProtoReflect().Descriptor())
	return opts.Marshal(m)
}

// statusBytes serializes the gRPC status of a failure, so a replay returns
// exactly the first response.
func statusBytes(fe *failure.Error) []byte {
	b, err := proto.Marshal(fe.GRPCStatus().Proto())
	if err != nil {
		return nil
	}
	return b
}

// replay returns a saved response: the output, or the saved failure.
func replay(s *Saved) (*Result, error) {
	if s.Status != nil {
		var st status.Status
		if err := proto.Unmarshal(s.Status, &st); err == nil {
			return nil, grpcstatus.FromProto(&st).Err()
		}
	}
	return &Result{InvocationID: s.InvocationID, Output: s.Output, AuditID: s.AuditID, Replayed: true}, nil
}
