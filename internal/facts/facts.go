// Package facts is what a command's proto declaration says about each of
// its fields, compiled once from the descriptors when a manifest loads
// (manifest.Load) rather than rediscovered per call: the kind of every
// field's values (money, enum, timestamp, identifier, free text, …), which
// fields are sensitive and their JSON pointers, the descriptions the
// approver reads, the declared deadline as a duration.
//
// The descriptor set a build ships carries no comments (the build strips
// source info); the comments reach the runtime in the manifest's input
// schema, where the build put them. So the kinds are read from the
// descriptors, and the descriptions the approver reads from the input
// schema, field by field.
//
// It is the runtime's one reading of the Mandate field options and of the
// buf.validate string rules that decide a field's kind; the build-time JSON
// Schema projection (internal/schema/jsonschema) reads sensitivity and
// comments through it too, so the tool descriptor, the executor's redaction
// and the approver's prompt cannot disagree on them.
package facts

import (
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// Kind is how one value of a field reads: what the approver is shown it
// as, and what the declaration constrains it to.
type Kind string

// The kinds of a value.
const (
	// Text is a string the declaration does not constrain to a shape (a
	// reason, a title, a note): whatever the caller wrote.
	Text Kind = "text"
	// Identifier is a string the declaration constrains to a shape: an
	// anchored buf.validate pattern without wildcards, a well-known format
	// (uuid, email, hostname, ip, uri), bytes (base64), a duration.
	Identifier Kind = "identifier"
	// Enum is one of the declared values (Field.Values): a proto enum, or a
	// string restricted by buf.validate `in` or `const`.
	Enum Kind = "enum"
	// Money is a message with exactly a string currency_code and an integer
	// amount_minor (the helpdesk sample's Money, and any other so shaped).
	Money Kind = "money"
	// Timestamp is a google.protobuf.Timestamp (an RFC 3339 string).
	Timestamp Kind = "timestamp"
	// Number is a numeric field (a JSON number, or for 64-bit integers a
	// decimal string) or a numeric wrapper.
	Number Kind = "number"
	// Boolean is a bool field or a BoolValue.
	Boolean Kind = "boolean"
	// Message is any other message: its fields are in Field.Message.
	Message Kind = "message"
	// JSON is google.protobuf.Struct, Value, ListValue or Any: JSON whose
	// shape the declaration leaves open.
	JSON Kind = "json"
	// Null is google.protobuf.NullValue.
	Null Kind = "null"
)

// Command is what a command's RPC declares, compiled once.
type Command struct {
	// Input and Output are the request and result messages.
	Input, Output *MessageFacts
	// InputSensitive and OutputSensitive are the JSON pointers (proto
	// names, "*" for any element or key) of their sensitive fields, sorted:
	// what the executor withholds from the audit, the prompt and the
	// domain event.
	InputSensitive, OutputSensitive []string
	// Deadline is the declared deadline of a dispatch; 0 when none is
	// declared (the deployment's default applies).
	Deadline time.Duration
}

// MessageFacts are the facts of one message.
type MessageFacts struct {
	// Name is the message's full name.
	Name protoreflect.FullName
	// Fields are its fields, in declaration order.
	Fields []*Field
	byName map[string]*Field
}

// Field returns the field with proto name name, nil without one.
func (m *MessageFacts) Field(name string) *Field {
	if m == nil {
		return nil
	}
	return m.byName[name]
}

// Field is the facts of one field.
type Field struct {
	// Name is the proto name, the field's JSON key.
	Name string
	// Description is what the declaration says of the field: its comment,
	// else its type's (a message's comment, an enum's values with theirs),
	// on one line.
	Description string
	// ElementDescription is what it says of one element of a list or one
	// value of a map: its type's comment.
	ElementDescription string
	// Sensitive reports `(mandate.v1.field).sensitive`: the field's value,
	// whole, is withheld from everything a human or a log reads.
	Sensitive bool
	// List and Map report a repeated field or a map; Kind, Values and
	// Message then describe one element (one map value).
	List, Map bool
	// Kind is how one value reads.
	Kind Kind
	// Values are the declared values of an Enum, in declaration order.
	Values []EnumValue
	// Message is the value's message, for Message and Money.
	Message *MessageFacts
}

// EnumValue is one declared value of an enum.
type EnumValue struct {
	// Name is the value as JSON spells it.
	Name string
	// Description is its comment: what it means.
	Description string
}

// Value returns the declared value named name.
func (f *Field) Value(name string) (EnumValue, bool) {
	for _, v := range f.Values {
		if v.Name == name {
			return v, true
		}
	}
	return EnumValue{}, false
}

// compiled counts the messages compiled in this process (Compiled).
var compiled atomic.Int64

// Compiled is how many messages this process has compiled facts of: a
// loaded manifest compiles each of its messages once, and nothing per call.
func Compiled() int64 { return compiled.Load() }

// Compiler compiles facts, each message once however many commands use
// it. It is not safe for concurrent use; what it returns is read-only and
// is.
type Compiler struct {
	messages map[protoreflect.FullName]*MessageFacts
}

// NewCompiler returns an empty Compiler.
func NewCompiler() *Compiler {
	return &Compiler{messages: map[protoreflect.FullName]*MessageFacts{}}
}

// Command compiles the facts of method md; deadline is the declared
// deadline ("" or a Go duration such as "10s"; one that does not parse,
// or is not positive, counts as none), inputSchema the build's JSON Schema
// of the input (manifest.Command.InputSchema), which the descriptions are
// read from (none without it).
func (c *Compiler) Command(md protoreflect.MethodDescriptor, deadline string, inputSchema []byte) *Command {
	out := &Command{
		Input:           c.Message(md.Input()),
		Output:          c.Message(md.Output()),
		InputSensitive:  SensitivePaths(md.Input()),
		OutputSensitive: SensitivePaths(md.Output()),
	}
	if d, err := time.ParseDuration(deadline); err == nil && d > 0 {
		out.Deadline = d
	}
	var root map[string]any
	if json.Unmarshal(inputSchema, &root) == nil && root != nil {
		d := describer{root: root, done: map[*MessageFacts]bool{}}
		d.message(out.Input, root, 0)
	}
	return out
}

// Message compiles the facts of md (once per Compiler).
func (c *Compiler) Message(md protoreflect.MessageDescriptor) *MessageFacts {
	if m, ok := c.messages[md.FullName()]; ok {
		return m
	}
	compiled.Add(1)
	m := &MessageFacts{Name: md.FullName(), byName: map[string]*Field{}}
	c.messages[md.FullName()] = m // before the fields: a message may contain itself
	fields := md.Fields()
	for i := range fields.Len() {
		f := c.field(fields.Get(i))
		m.Fields = append(m.Fields, f)
		m.byName[f.Name] = f
	}
	return m
}

func (c *Compiler) field(fd protoreflect.FieldDescriptor) *Field {
	f := &Field{Name: string(fd.Name()), Sensitive: IsSensitive(fd), List: fd.IsList(), Map: fd.IsMap()}
	r, err := protovalidate.ResolveFieldRules(fd)
	if err != nil || r.GetIgnore() == validate.Ignore_IGNORE_ALWAYS {
		r = nil
	}
	value := fd
	switch {
	case fd.IsList():
		r = r.GetRepeated().GetItems()
	case fd.IsMap():
		r = r.GetMap().GetValues()
		value = fd.MapValue()
	}
	c.value(f, value, r)
	return f
}

// value sets f's kind from one value of fd under rules r.
func (c *Compiler) value(f *Field, fd protoreflect.FieldDescriptor, r *validate.FieldRules) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		f.Kind = Boolean
	case protoreflect.StringKind:
		f.Kind, f.Values = stringKind(r.GetString())
	case protoreflect.BytesKind:
		f.Kind = Identifier
	case protoreflect.EnumKind:
		if fd.Enum().FullName() == "google.protobuf.NullValue" {
			f.Kind = Null
			return
		}
		f.Kind, f.Values = Enum, enumValues(fd.Enum(), r.GetEnum())
	case protoreflect.MessageKind, protoreflect.GroupKind:
		c.message(f, fd.Message(), r)
	default:
		f.Kind = Number
	}
}

func (c *Compiler) message(f *Field, md protoreflect.MessageDescriptor, r *validate.FieldRules) {
	switch md.FullName() {
	case "google.protobuf.Timestamp":
		f.Kind = Timestamp
	case "google.protobuf.Duration":
		f.Kind = Identifier
	case "google.protobuf.FieldMask":
		f.Kind = Text
	case "google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue", "google.protobuf.Any":
		f.Kind = JSON
	case "google.protobuf.DoubleValue", "google.protobuf.FloatValue",
		"google.protobuf.Int64Value", "google.protobuf.UInt64Value",
		"google.protobuf.Int32Value", "google.protobuf.UInt32Value",
		"google.protobuf.BoolValue", "google.protobuf.StringValue", "google.protobuf.BytesValue":
		// A wrapper is its bare value; the field's rules apply to it.
		c.value(f, md.Fields().ByName("value"), r)
	default:
		f.Message = c.Message(md)
		f.Kind = Message
		if isMoney(md) {
			f.Kind = Money
		}
	}
}

// isMoney reports whether md is exactly a string currency_code and an
// integer amount_minor.
func isMoney(md protoreflect.MessageDescriptor) bool {
	fields := md.Fields()
	if fields.Len() != 2 {
		return false
	}
	code, amount := fields.ByName("currency_code"), fields.ByName("amount_minor")
	if code == nil || amount == nil || code.Cardinality() == protoreflect.Repeated || amount.Cardinality() == protoreflect.Repeated {
		return false
	}
	switch amount.Kind() {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
	default:
		return false
	}
	return code.Kind() == protoreflect.StringKind
}

// stringKind is the kind of a string under its buf.validate rules: an
// enum when they list the values (`in`, else `const`); an identifier when
// they pin its shape (a well-known format, or a pattern that is anchored
// and lets no prose through); else text.
func stringKind(sr *validate.StringRules) (Kind, []EnumValue) {
	if sr == nil {
		return Text, nil
	}
	if in := sr.GetIn(); len(in) > 0 {
		values := make([]EnumValue, len(in))
		for i, v := range in {
			values[i] = EnumValue{Name: v}
		}
		return Enum, values
	}
	if sr.HasConst() {
		return Enum, []EnumValue{{Name: sr.GetConst()}}
	}
	switch {
	case sr.GetUuid(), sr.GetHostname(), sr.GetIpv4(), sr.GetIpv6(), sr.GetIp(), sr.GetUri(), sr.GetUriRef():
		return Identifier, nil
	case sr.HasPattern():
		if AnchoredPattern(sr.GetPattern()) {
			return Identifier, nil
		}
		return Text, nil
	case sr.HasPrefix() || sr.HasSuffix() || sr.HasContains():
		// A prefix, suffix or substring leaves the rest of the value open.
		return Text, nil
	case sr.GetEmail():
		return Identifier, nil
	}
	return Text, nil
}

// AnchoredPattern reports whether pattern p pins a whole value to a shape:
// anchored at both ends, with no wildcard ("."), negated class ("[^…]") or
// negated or Unicode-category escape (\S, \W, \D, \p, \P) that would let
// prose through.
func AnchoredPattern(p string) bool {
	if !strings.HasPrefix(p, "^") || !strings.HasSuffix(p, "$") {
		return false
	}
	inClass := false
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '\\' && i+1 < len(p):
			i++
			if strings.IndexByte("SWDpP", p[i]) >= 0 {
				return false
			}
		case c == '[' && !inClass:
			inClass = true
			if i+1 < len(p) && p[i+1] == '^' {
				return false
			}
		case c == ']' && inClass:
			inClass = false
		case c == '.' && !inClass:
			return false
		}
	}
	return true
}

// enumValues are the values of ed that the rules er allow, in declaration
// order.
func enumValues(ed protoreflect.EnumDescriptor, er *validate.EnumRules) []EnumValue {
	var out []EnumValue
	values := ed.Values()
	for i := range values.Len() {
		v := values.Get(i)
		if EnumValueAllowed(er, int32(v.Number())) {
			out = append(out, EnumValue{Name: string(v.Name())})
		}
	}
	return out
}

// EnumValueAllowed reports whether the buf.validate enum rules er (nil:
// none) allow the value numbered n by its const, in and not_in.
func EnumValueAllowed(er *validate.EnumRules, n int32) bool {
	switch {
	case er.HasConst() && er.GetConst() != n:
		return false
	case len(er.GetIn()) > 0 && !slices.Contains(er.GetIn(), n):
		return false
	}
	return !slices.Contains(er.GetNotIn(), n)
}

// IsSensitive reports whether fd is declared `(mandate.v1.field).sensitive`.
func IsSensitive(fd protoreflect.FieldDescriptor) bool {
	opts := fd.Options()
	if opts == nil || !proto.HasExtension(opts, mandatev1.E_Field) {
		return false
	}
	fo, _ := proto.GetExtension(opts, mandatev1.E_Field).(*mandatev1.FieldOptions)
	return fo.GetSensitive()
}

// SensitivePaths lists the JSON pointers (proto names, `*` for any element
// or key) of every sensitive field reachable from md, sorted. A message
// that contains itself is followed once along each path.
func SensitivePaths(md protoreflect.MessageDescriptor) []string {
	var out []string
	var walk func(md protoreflect.MessageDescriptor, prefix string, seen map[protoreflect.FullName]bool)
	walk = func(md protoreflect.MessageDescriptor, prefix string, seen map[protoreflect.FullName]bool) {
		if seen[md.FullName()] || strings.HasPrefix(string(md.FullName()), "google.protobuf.") {
			return
		}
		seen[md.FullName()] = true
		defer delete(seen, md.FullName())
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			p := prefix + "/" + string(fd.Name())
			if IsSensitive(fd) {
				out = append(out, p)
				continue
			}
			if fd.IsList() || fd.IsMap() {
				p += "/*"
			}
			if fd.IsMap() {
				fd = fd.MapValue()
			}
			if fd.Message() != nil {
				walk(fd.Message(), p, seen)
			}
		}
	}
	walk(md, "", map[protoreflect.FullName]bool{})
	sort.Strings(out)
	return out
}

// describer reads the descriptions of a command's input from the build's
// JSON Schema of it: each field's schema (a property, an array's items, a
// map's additionalProperties) carries what the declaration says of it.
type describer struct {
	root map[string]any
	done map[*MessageFacts]bool
}

// maxDescribeDepth bounds the $ref and combinator chains followed.
const maxDescribeDepth = 16

// message describes m's fields from s, m's schema.
func (d *describer) message(m *MessageFacts, s map[string]any, depth int) {
	if m == nil || s == nil || d.done[m] || depth > maxDescribeDepth {
		return
	}
	d.done[m] = true
	props, _ := d.facet(s, "properties", 0).(map[string]any)
	for _, f := range m.Fields {
		p, _ := props[f.Name].(map[string]any)
		if p == nil {
			continue
		}
		desc, _ := d.facet(p, "description", 0).(string)
		f.Description = oneLine(desc)
		value := p
		switch {
		case f.List:
			value, _ = d.facet(p, "items", 0).(map[string]any)
		case f.Map:
			value, _ = d.facet(p, "additionalProperties", 0).(map[string]any)
		}
		if f.List || f.Map {
			desc, _ = d.facet(value, "description", 0).(string)
			f.ElementDescription = oneLine(desc)
		}
		if f.Kind == Enum {
			// An enum's schema says what each value means, a line each:
			// "NAME: what it means".
			for line := range strings.SplitSeq(desc, "\n") {
				for i := range f.Values {
					if meaning, ok := strings.CutPrefix(line, f.Values[i].Name+": "); ok {
						f.Values[i].Description = strings.TrimSpace(meaning)
					}
				}
			}
		}
		if f.Message != nil && value != nil {
			d.message(f.Message, d.resolve(value, 0), depth+1)
		}
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// resolve follows a $ref within the root schema.
func (d *describer) resolve(s map[string]any, depth int) map[string]any {
	ref, ok := s["$ref"].(string)
	if !ok || depth > maxDescribeDepth {
		return s
	}
	if ref == "#" {
		return d.root
	}
	name, ok := strings.CutPrefix(ref, "#/$defs/")
	if !ok {
		return s
	}
	defs, _ := d.root["$defs"].(map[string]any)
	def, _ := defs[name].(map[string]any)
	if def == nil {
		return s
	}
	return d.resolve(def, depth+1)
}

// facet returns keyword key of s, or of the first of its allOf, anyOf and
// oneOf branches that has it.
func (d *describer) facet(s map[string]any, key string, depth int) any {
	if s == nil || depth > maxDescribeDepth {
		return nil
	}
	s = d.resolve(s, 0)
	if v, ok := s[key]; ok {
		return v
	}
	for _, comb := range []string{"allOf", "anyOf", "oneOf"} {
		branches, _ := s[comb].([]any)
		for _, b := range branches {
			if bs, ok := b.(map[string]any); ok {
				if v := d.facet(bs, key, depth+1); v != nil {
					return v
				}
			}
		}
	}
	return nil
}
