// Package schematest holds inputs for tests of the decoding guards
// (schema.Unmarshal and the gRPC codec of internal/server).
package schematest

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// PanickingMap returns `message M { map<int32, M> m = 1; }` and a message whose
// one map entry carries its int32 key twice, the second time as a
// length-delimited field: the input
// on which protobuf-go v1.36.12 panics when it decodes into a dynamic message.
func PanickingMap(t testing.TB) (protoreflect.MessageDescriptor, []byte) {
	t.Helper()
	label, msg := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum()
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String("guard.proto"), Package: proto.String("guard"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("M"),
			Field: []*descriptorpb.FieldDescriptorProto{{Name: proto.String("m"), JsonName: proto.String("m"), Number: proto.Int32(1),
				Label: descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum(), Type: msg, TypeName: proto.String(".guard.M.MEntry")}},
			NestedType: []*descriptorpb.DescriptorProto{{
				Name: proto.String("MEntry"), Options: &descriptorpb.MessageOptions{MapEntry: proto.Bool(true)},
				Field: []*descriptorpb.FieldDescriptorProto{
					{Name: proto.String("key"), JsonName: proto.String("key"), Number: proto.Int32(1), Label: label, Type: descriptorpb.FieldDescriptorProto_TYPE_INT32.Enum()},
					{Name: proto.String("value"), JsonName: proto.String("value"), Number: proto.Int32(2), Label: label, Type: msg, TypeName: proto.String(".guard.M")},
				},
			}},
		}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	entry := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 7) // key 7, then the key again, length-delimited
	entry = protowire.AppendBytes(protowire.AppendTag(entry, 1, protowire.BytesType), []byte("x"))
	return fd.Messages().Get(0), protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), entry)
}
