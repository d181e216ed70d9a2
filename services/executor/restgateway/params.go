package restgateway

import (
	"errors"
	"fmt"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// separator is the generator's default repeated_path_param_separator.
const separator = ","

// checkParam refuses what the generator refuses as a path variable: a map,
// a message that is not a scalar well-known type, a repeated message.
func checkParam(fields []protoreflect.FieldDescriptor) error {
	fd := fields[len(fields)-1]
	if fd.IsMap() {
		return errors.New("a map cannot be a path variable")
	}
	if m := fd.Message(); m != nil {
		if _, ok := wellKnown[m.FullName()]; !ok || fd.IsList() {
			return fmt.Errorf("%s cannot be a path variable", m.FullName())
		}
	}
	return nil
}

// setParam sets a path variable. A nested path in a proto3 file goes
// through runtime.PopulateFieldFromPath, as the generated code's does;
// anything else is converted with the runtime function the generator
// picks for the field's type.
func setParam(msg protoreflect.Message, p pathParam, val string) error {
	if len(p.fields) > 1 && p.fields[0].ParentFile().Syntax() != protoreflect.Proto2 {
		return runtime.PopulateFieldFromPath(msg.Interface(), p.name, val)
	}
	parent := mutableParent(msg, p.fields)
	fd := p.fields[len(p.fields)-1]
	if fd.IsList() {
		vals, err := convertList(fd, val)
		if err != nil {
			return err
		}
		list := parent.NewField(fd).List()
		for _, v := range vals {
			list.Append(v)
		}
		parent.Set(fd, protoreflect.ValueOfList(list))
		return nil
	}
	if m := fd.Message(); m != nil {
		v, err := wellKnown[m.FullName()](val)
		if err != nil {
			return err
		}
		return setMessage(parent, fd, v)
	}
	v, err := convert(fd, val)
	if err != nil {
		return err
	}
	parent.Set(fd, v)
	return nil
}

// convert is the runtime.<Type> conversion of a scalar or enum.
func convert(fd protoreflect.FieldDescriptor, val string) (protoreflect.Value, error) {
	switch fd.Kind() {
	case protoreflect.DoubleKind:
		return wrap(runtime.Float64(val))
	case protoreflect.FloatKind:
		return wrap(runtime.Float32(val))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return wrap(runtime.Int64(val))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return wrap(runtime.Uint64(val))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return wrap(runtime.Int32(val))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return wrap(runtime.Uint32(val))
	case protoreflect.BoolKind:
		return wrap(runtime.Bool(val))
	case protoreflect.StringKind:
		return wrap(runtime.String(val))
	case protoreflect.BytesKind:
		return wrap(runtime.Bytes(val))
	case protoreflect.EnumKind:
		e, err := runtime.Enum(val, enumValues(fd.Enum()))
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(e)), err
	}
	return protoreflect.Value{}, fmt.Errorf("unsupported field type %s", fd.Kind())
}

// convertList is the runtime.<Type>Slice conversion of a repeated field.
func convertList(fd protoreflect.FieldDescriptor, val string) ([]protoreflect.Value, error) {
	switch fd.Kind() {
	case protoreflect.DoubleKind:
		return wrapAll(runtime.Float64Slice(val, separator))
	case protoreflect.FloatKind:
		return wrapAll(runtime.Float32Slice(val, separator))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return wrapAll(runtime.Int64Slice(val, separator))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return wrapAll(runtime.Uint64Slice(val, separator))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return wrapAll(runtime.Int32Slice(val, separator))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return wrapAll(runtime.Uint32Slice(val, separator))
	case protoreflect.BoolKind:
		return wrapAll(runtime.BoolSlice(val, separator))
	case protoreflect.StringKind:
		return wrapAll(runtime.StringSlice(val, separator))
	case protoreflect.BytesKind:
		return wrapAll(runtime.BytesSlice(val, separator))
	case protoreflect.EnumKind:
		es, err := runtime.EnumSlice(val, separator, enumValues(fd.Enum()))
		if err != nil {
			return nil, err
		}
		out := make([]protoreflect.Value, len(es))
		for i, e := range es {
			out[i] = protoreflect.ValueOfEnum(protoreflect.EnumNumber(e))
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported field type %s", fd.Kind())
}

func wrap[T any](v T, err error) (protoreflect.Value, error) {
	if err != nil {
		return protoreflect.Value{}, err
	}
	return protoreflect.ValueOf(v), nil
}

func wrapAll[T any](vs []T, err error) ([]protoreflect.Value, error) {
	if err != nil {
		return nil, err
	}
	out := make([]protoreflect.Value, len(vs))
	for i, v := range vs {
		out[i] = protoreflect.ValueOf(v)
	}
	return out, nil
}

// enumValues is the name → number map the generated code passes to
// runtime.Enum.
func enumValues(ed protoreflect.EnumDescriptor) map[string]int32 {
	vals := ed.Values()
	m := make(map[string]int32, vals.Len())
	for i := range vals.Len() {
		m[string(vals.Get(i).Name())] = int32(vals.Get(i).Number())
	}
	return m
}

// wellKnown are the message types the generator accepts as path
// variables, with their runtime conversions.
var wellKnown = map[protoreflect.FullName]func(string) (proto.Message, error){
	"google.protobuf.Timestamp":   msgConv(runtime.Timestamp),
	"google.protobuf.Duration":    msgConv(runtime.Duration),
	"google.protobuf.StringValue": msgConv(runtime.StringValue),
	"google.protobuf.FloatValue":  msgConv(runtime.FloatValue),
	"google.protobuf.DoubleValue": msgConv(runtime.DoubleValue),
	"google.protobuf.BoolValue":   msgConv(runtime.BoolValue),
	"google.protobuf.BytesValue":  msgConv(runtime.BytesValue),
	"google.protobuf.Int32Value":  msgConv(runtime.Int32Value),
	"google.protobuf.UInt32Value": msgConv(runtime.UInt32Value),
	"google.protobuf.Int64Value":  msgConv(runtime.Int64Value),
	"google.protobuf.UInt64Value": msgConv(runtime.UInt64Value),
}

func msgConv[M proto.Message](f func(string) (M, error)) func(string) (proto.Message, error) {
	return func(s string) (proto.Message, error) { return f(s) }
}
