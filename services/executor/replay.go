package executor

import (
	"google.golang.org/genproto/googleapis/rpc/status"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/schema"
)

// marshalOutput encodes a result with proto field names, so outputs read
// like inputs.
func marshalOutput(m proto.Message) ([]byte, error) {
	if m == nil {
		return []byte("{}"), nil
	}
	return schema.MarshalOutput(m)
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
