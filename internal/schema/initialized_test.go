package schema_test

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/mandate-dev/mandate/internal/schema"
)

// initFile declares, in proto2, messages that can and cannot lack a
// required field.
func initFile(t *testing.T) protoreflect.FileDescriptor {
	t.Helper()
	opt, req, rep := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), descriptorpb.FieldDescriptorProto_LABEL_REQUIRED.Enum(), descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
	str, msg := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(), descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum()
	field := func(name string, n int32, label *descriptorpb.FieldDescriptorProto_Label, typ *descriptorpb.FieldDescriptorProto_Type, typeName string) *descriptorpb.FieldDescriptorProto {
		f := &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(n), Label: label, Type: typ}
		if typeName != "" {
			f.TypeName = proto.String(".t." + typeName)
		}
		return f
	}
	fd := &descriptorpb.FileDescriptorProto{
		Name: proto.String("t.proto"), Package: proto.String("t"), Syntax: proto.String("proto2"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("Plain"), Field: []*descriptorpb.FieldDescriptorProto{field("a", 1, opt, str, "")}},
			{Name: proto.String("Required"), Field: []*descriptorpb.FieldDescriptorProto{field("a", 1, req, str, "")}},
			{Name: proto.String("HoldsRequired"), Field: []*descriptorpb.FieldDescriptorProto{field("r", 1, rep, msg, "Required")}},
			{Name: proto.String("Recursive"), Field: []*descriptorpb.FieldDescriptorProto{field("self", 1, opt, msg, "Recursive"), field("p", 2, opt, msg, "Plain")}},
			{Name: proto.String("RecursiveRequired"), Field: []*descriptorpb.FieldDescriptorProto{field("self", 1, opt, msg, "RecursiveRequired"), field("r", 2, opt, msg, "Required")}},
			{Name: proto.String("Extendable"), ExtensionRange: []*descriptorpb.DescriptorProto_ExtensionRange{{Start: proto.Int32(100), End: proto.Int32(200)}}},
		},
	}
	f, err := protodesc.NewFile(fd, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestCanLackRequired(t *testing.T) {
	f := initFile(t)
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"Plain", false},
		{"Required", true},
		{"HoldsRequired", true},
		{"Recursive", false},
		{"RecursiveRequired", true},
		{"Extendable", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := f.Messages().ByName(protoreflect.Name(tc.name))
			for range 2 { // computed, then cached
				if got := schema.CanLackRequired(md); got != tc.want {
					t.Fatalf("CanLackRequired(%s) = %v, want %v", tc.name, got, tc.want)
				}
			}
			if err := proto.CheckInitialized(dynamicpb.NewMessage(md)); err != nil && !tc.want {
				t.Fatalf("CheckInitialized of an empty %s: %v", tc.name, err)
			}
		})
	}
}
