package openapi

import (
	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"buf.build/go/protovalidate"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Spellings protojson uses for the well-known types and 64-bit integers.
const (
	timestampPattern = `^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})$`
	durationPattern  = `^-?[0-9]+(\.[0-9]{1,9})?s$`
	int64Pattern     = `^-?[0-9]+$`
	uint64Pattern    = `^[0-9]+$`
)

// ref is the schema of a field holding md: a reference to its component.
func (b *builder) ref(md protoreflect.MessageDescriptor) Schema {
	return Schema{"$ref": SchemaRef(string(md.FullName()))}
}

// message makes sure md (and every message and enum it reaches) has a
// component schema.
func (b *builder) message(md protoreflect.MessageDescriptor) {
	name := string(md.FullName())
	if _, done := b.schemas[name]; done {
		return
	}
	if s, ok := wkt(md); ok {
		b.schemas[name] = s
		return
	}
	b.schemas[name] = Schema{} // placeholder: stops recursion
	b.schemas[name] = b.messageSchema(md, nil)
}

// messageSchema is the closed object schema of md without the fields in
// exclude (those a path template binds).
func (b *builder) messageSchema(md protoreflect.MessageDescriptor, exclude map[string]bool) Schema {
	props := Schema{}
	required := []string{}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if exclude[string(fd.Name())] {
			continue
		}
		props[string(fd.Name())] = b.field(fd)
		if isRequired(fd) {
			required = append(required, string(fd.Name()))
		}
	}
	s := Schema{
		"type":                 "object",
		"properties":           props,
		"additionalProperties": false,
	}
	if d := comment(md); d != "" {
		s["description"] = d
	}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

// field is the schema of fd's value as protojson writes it, with the
// field's description and the rules of its declaration JSON Schema can
// state.
func (b *builder) field(fd protoreflect.FieldDescriptor) Schema {
	var s Schema
	switch {
	case fd.IsMap():
		s = Schema{
			"type":                 "object",
			"additionalProperties": b.singular(fd.MapValue()),
		}
		if names := mapKeys(fd.MapKey().Kind()); names != nil {
			s["propertyNames"] = names
		}
	case fd.IsList():
		s = Schema{"type": "array", "items": b.singular(fd)}
	default:
		s = b.singular(fd)
		// EmitUnpopulated writes an unset message field as null (but
		// leaves unset oneof members and proto3 optional fields out).
		if fd.Message() != nil && fd.ContainingOneof() == nil && fd.Message().FullName() != "google.protobuf.Value" {
			s = nullable(s)
		}
	}
	applyRules(s, fd)
	if d := comment(fd); d != "" {
		s["description"] = d
	}
	if o, ok := fd.Options().(interface{ GetDeprecated() bool }); ok && o.GetDeprecated() {
		s["deprecated"] = true
	}
	return s
}

func nullable(s Schema) Schema {
	if t, ok := s["type"].(string); ok && s["$ref"] == nil {
		s["type"] = []string{t, "null"}
		return s
	}
	return Schema{"anyOf": []Schema{s, {"type": "null"}}}
}

// mapKeys constrains a map's keys, which JSON always spells as strings.
func mapKeys(k protoreflect.Kind) Schema {
	switch k {
	case protoreflect.BoolKind:
		return Schema{"enum": []string{"true", "false"}}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return Schema{"pattern": int64Pattern}
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return Schema{"pattern": uint64Pattern}
	}
	return nil
}

// singular is the schema of one value of fd (an element, for lists and
// maps).
func (b *builder) singular(fd protoreflect.FieldDescriptor) Schema {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return Schema{"type": "boolean"}
	case protoreflect.StringKind:
		return Schema{"type": "string"}
	case protoreflect.BytesKind:
		return Schema{"type": "string", "contentEncoding": "base64"}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return Schema{"type": "integer", "format": "int32"}
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return Schema{"type": "integer", "minimum": 0, "maximum": 4294967295}
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		// protojson writes 64-bit integers as strings.
		return Schema{"type": "string", "format": "int64", "pattern": int64Pattern}
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return Schema{"type": "string", "pattern": uint64Pattern}
	case protoreflect.FloatKind:
		return Schema{"type": "number", "format": "float"}
	case protoreflect.DoubleKind:
		return Schema{"type": "number", "format": "double"}
	case protoreflect.EnumKind:
		ed := fd.Enum()
		if ed.FullName() == "google.protobuf.NullValue" {
			return Schema{"type": "null"}
		}
		b.enum(ed)
		return Schema{"$ref": SchemaRef(string(ed.FullName()))}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		md := fd.Message()
		if s, ok := wkt(md); ok {
			return s
		}
		b.message(md)
		return b.ref(md)
	}
	return Schema{}
}

// enum adds the component of ed: its value names, as protojson writes them.
func (b *builder) enum(ed protoreflect.EnumDescriptor) {
	name := string(ed.FullName())
	if _, done := b.schemas[name]; done {
		return
	}
	values := ed.Values()
	names := make([]string, 0, values.Len())
	for i := range values.Len() {
		names = append(names, string(values.Get(i).Name()))
	}
	s := Schema{"type": "string", "enum": names}
	if d := comment(ed); d != "" {
		s["description"] = d
	}
	b.schemas[name] = s
}

// wkt is the protojson form of a well-known type.
func wkt(md protoreflect.MessageDescriptor) (Schema, bool) {
	switch md.FullName() {
	case "google.protobuf.Timestamp":
		return Schema{"type": "string", "format": "date-time", "pattern": timestampPattern}, true
	case "google.protobuf.Duration":
		return Schema{"type": "string", "pattern": durationPattern, "description": "A duration in seconds with an `s` suffix, e.g. `1.5s`."}, true
	case "google.protobuf.Struct":
		return Schema{"type": "object"}, true
	case "google.protobuf.Value":
		return Schema{}, true
	case "google.protobuf.ListValue":
		return Schema{"type": "array"}, true
	case "google.protobuf.FieldMask":
		return Schema{"type": "string"}, true
	case "google.protobuf.Empty":
		return Schema{"type": "object", "properties": Schema{}, "additionalProperties": false}, true
	case "google.protobuf.Any":
		return Schema{
			"type":       "object",
			"properties": Schema{"@type": Schema{"type": "string"}},
			"required":   []string{"@type"},
		}, true
	case "google.protobuf.DoubleValue", "google.protobuf.FloatValue":
		return Schema{"type": "number"}, true
	case "google.protobuf.Int32Value", "google.protobuf.UInt32Value":
		return Schema{"type": "integer"}, true
	case "google.protobuf.Int64Value":
		return Schema{"type": "string", "pattern": int64Pattern}, true
	case "google.protobuf.UInt64Value":
		return Schema{"type": "string", "pattern": uint64Pattern}, true
	case "google.protobuf.BoolValue":
		return Schema{"type": "boolean"}, true
	case "google.protobuf.StringValue":
		return Schema{"type": "string"}, true
	case "google.protobuf.BytesValue":
		return Schema{"type": "string", "contentEncoding": "base64"}, true
	}
	return nil, false
}

// isRequired reports whether a request must carry fd: it is declared
// `field_behavior = REQUIRED` or `(buf.validate.field).required`.
func isRequired(fd protoreflect.FieldDescriptor) bool {
	if opts := fd.Options(); opts != nil && proto.HasExtension(opts, annotations.E_FieldBehavior) {
		fbs, _ := proto.GetExtension(opts, annotations.E_FieldBehavior).([]annotations.FieldBehavior)
		for _, fb := range fbs {
			if fb == annotations.FieldBehavior_REQUIRED {
				return true
			}
		}
	}
	r, err := protovalidate.ResolveFieldRules(fd)
	return err == nil && r.GetRequired()
}

// applyRules copies the length and size rules of fd's buf.validate
// declaration; the server enforces every rule, these are the ones a client
// can check before sending.
func applyRules(s Schema, fd protoreflect.FieldDescriptor) {
	r, err := protovalidate.ResolveFieldRules(fd)
	if err != nil || r == nil || r.GetIgnore() == validate.Ignore_IGNORE_ALWAYS {
		return
	}
	if fd.IsList() {
		if rr := r.GetRepeated(); rr != nil {
			if rr.HasMinItems() {
				s["minItems"] = rr.GetMinItems()
			}
			if rr.HasMaxItems() {
				s["maxItems"] = rr.GetMaxItems()
			}
			if rr.GetUnique() {
				s["uniqueItems"] = true
			}
		}
		return
	}
	if fd.IsMap() {
		if mr := r.GetMap(); mr != nil {
			if mr.HasMinPairs() {
				s["minProperties"] = mr.GetMinPairs()
			}
			if mr.HasMaxPairs() {
				s["maxProperties"] = mr.GetMaxPairs()
			}
		}
		return
	}
	if sr := r.GetString(); sr != nil {
		// A zero value that is let through makes a minimum meaningless.
		zeroOK := r.GetIgnore() == validate.Ignore_IGNORE_IF_ZERO_VALUE
		if sr.HasMinLen() && !zeroOK {
			s["minLength"] = sr.GetMinLen()
		}
		if sr.HasMaxLen() {
			s["maxLength"] = sr.GetMaxLen()
		}
		if sr.HasLen() {
			s["maxLength"] = sr.GetLen()
			if !zeroOK {
				s["minLength"] = sr.GetLen()
			}
		}
	}
}
