package schema

import (
	"fmt"

	"google.golang.org/protobuf/proto"
)

// Unmarshal decodes b into m with opts, and returns an error where the
// protobuf runtime panics on malformed input. protobuf-go v1.36.12 panics
// ("cannot convert nil to map key") on a map entry whose integer key arrives
// with the wrong wire type when it decodes into a dynamic message, and
// Mandate decodes what callers and backends send into dynamic messages: a
// malformed message must be refused like any other, not crash the call.
func Unmarshal(opts proto.UnmarshalOptions, b []byte, m proto.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed %s: %v", m.ProtoReflect().Descriptor().FullName(), r)
		}
	}()
	return opts.Unmarshal(b, m)
}
