package jsonschema

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/mandate-dev/mandate/internal/facts"
	"github.com/mandate-dev/mandate/internal/schema"
)

// Dialect is the JSON Schema dialect of every schema this package builds.
const Dialect = "https://json-schema.org/draft/2020-12/schema"

// Mode selects what a schema describes.
type Mode int

const (
	// Input describes what a caller may send: every buf.validate rule that
	// JSON Schema can express, required fields, closed objects.
	Input Mode = iota
	// Output describes what a command returns as protojson: types and
	// descriptions only.
	Output
)

// Schema is a JSON Schema document or subschema. Maps marshal with sorted
// keys, so a Schema encodes deterministically.
type Schema = map[string]any

// Formats protovalidate checks that the projection spells as patterns.
const (
	// The WHATWG "valid e-mail address" grammar, which protovalidate's
	// string.email follows.
	emailPattern = "^[a-zA-Z0-9.!#$%&'*+/=?^_`{|}~-]+@[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(?:\\.[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$"
	uuidPattern  = `^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`
)

var nonFinite = []any{"NaN", "Infinity", "-Infinity"}

// Build returns the JSON Schema of message md: an object at the root,
// non-recursive messages inlined, recursive ones under $defs.
func Build(md protoreflect.MessageDescriptor, mode Mode) (Schema, error) {
	if schema.IsWKT(md.FullName()) && md.FullName() != "google.protobuf.Empty" && md.FullName() != "google.protobuf.Struct" {
		return nil, fmt.Errorf("schema: %s cannot be a root object", md.FullName())
	}
	b := &builder{
		mode:      mode,
		root:      md.FullName(),
		recursive: map[protoreflect.FullName]bool{},
		defs:      Schema{},
		zeroFails: map[protoreflect.FullName]map[protoreflect.FieldNumber]bool{},
	}
	if mode == Input {
		v, err := schema.Validator()
		if err != nil {
			return nil, fmt.Errorf("schema: %w", err)
		}
		b.validator = v
	}
	b.findRecursion(md, map[protoreflect.FullName]bool{})
	root, err := b.message(md)
	if err != nil {
		return nil, err
	}
	root["$schema"] = Dialect
	if len(b.defs) > 0 {
		root["$defs"] = b.defs
	}
	return root, nil
}

type builder struct {
	mode      Mode
	root      protoreflect.FullName
	recursive map[protoreflect.FullName]bool
	defs      Schema
	validator protovalidate.Validator
	zeroFails map[protoreflect.FullName]map[protoreflect.FieldNumber]bool
}

// findRecursion marks every message that can contain itself.
func (b *builder) findRecursion(md protoreflect.MessageDescriptor, stack map[protoreflect.FullName]bool) {
	if stack[md.FullName()] {
		b.recursive[md.FullName()] = true
		return
	}
	if schema.IsWKT(md.FullName()) {
		return
	}
	stack[md.FullName()] = true
	defer delete(stack, md.FullName())
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsMap() {
			fd = fd.MapValue()
		}
		if fd.Message() != nil {
			b.findRecursion(fd.Message(), stack)
		}
	}
}

// messageRef returns the schema used where a field holds message md.
func (b *builder) messageRef(md protoreflect.MessageDescriptor, r *validate.FieldRules) (Schema, error) {
	name := md.FullName()
	if wkt, ok := b.wkt(md, r); ok {
		return wkt, nil
	}
	if !b.recursive[name] {
		return b.message(md)
	}
	if name == b.root {
		return Schema{"$ref": "#"}, nil
	}
	if _, done := b.defs[string(name)]; !done {
		b.defs[string(name)] = Schema{} // placeholder: stops the recursion
		s, err := b.message(md)
		if err != nil {
			return nil, err
		}
		b.defs[string(name)] = s
	}
	return Schema{"$ref": "#/$defs/" + string(name)}, nil
}

// message returns the closed object schema of md.
func (b *builder) message(md protoreflect.MessageDescriptor) (Schema, error) {
	props := Schema{}
	var required []string
	var allOf []any
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		s, req, err := b.field(fd)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fd.FullName(), err)
		}
		props[string(fd.Name())] = s
		if req {
			required = append(required, string(fd.Name()))
		}
	}
	oneofs := md.Oneofs()
	for i := range oneofs.Len() {
		od := oneofs.Get(i)
		if od.IsSynthetic() {
			continue
		}
		req := false
		if b.mode == Input {
			r, err := protovalidate.ResolveOneofRules(od)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", od.FullName(), err)
			}
			req = r.GetRequired()
		}
		allOf = append(allOf, oneofConstraint(od, req))
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
	if len(allOf) > 0 {
		s["allOf"] = allOf
	}
	return s, nil
}

// oneofConstraint allows at most one member of od (exactly one if
// required).
func oneofConstraint(od protoreflect.OneofDescriptor, required bool) Schema {
	var branches []any
	var members []any
	fields := od.Fields()
	for i := range fields.Len() {
		req := Schema{"required": []string{string(fields.Get(i).Name())}}
		branches = append(branches, req)
		members = append(members, req)
	}
	if !required {
		branches = append(branches, Schema{"not": Schema{"anyOf": members}})
	}
	return Schema{"oneOf": branches}
}

// field returns the schema of fd and whether an input must carry it.
func (b *builder) field(fd protoreflect.FieldDescriptor) (Schema, bool, error) {
	var r *validate.FieldRules
	if b.mode == Input {
		var err error
		r, err = protovalidate.ResolveFieldRules(fd)
		if err != nil {
			return nil, false, err
		}
		if r.GetIgnore() == validate.Ignore_IGNORE_ALWAYS {
			r = nil
		}
	}
	var (
		s   Schema
		err error
	)
	switch {
	case fd.IsList():
		s, err = b.list(fd, r)
	case fd.IsMap():
		s, err = b.mapField(fd, r)
	default:
		s, err = b.singular(fd, r)
	}
	if err != nil {
		return nil, false, err
	}
	required := false
	if b.mode == Input {
		required, err = b.required(fd, r)
		if err != nil {
			return nil, false, err
		}
		ignoreZero := r.GetIgnore() == validate.Ignore_IGNORE_IF_ZERO_VALUE
		if ignoreZero && !fd.HasPresence() && !fd.IsList() && !fd.IsMap() {
			// The zero value skips every rule, so it is always accepted.
			s = Schema{"anyOf": []any{Schema{"const": zeroJSON(fd)}, s}}
		}
		if schema.FieldBehaviorRequired(fd) {
			required = true
		}
	}
	if d := comment(fd); d != "" {
		s["description"] = d
	}
	if facts.IsSensitive(fd) {
		s["writeOnly"] = true
		s["x-mandate-sensitive"] = true
	}
	if fo, ok := fd.Options().(*descriptorpb.FieldOptions); ok && fo.GetDeprecated() {
		s["deprecated"] = true
	}
	return s, required, nil
}

// required reports whether an input without fd is refused by protovalidate.
func (b *builder) required(fd protoreflect.FieldDescriptor, r *validate.FieldRules) (bool, error) {
	if r == nil {
		return false, nil
	}
	if r.GetRequired() {
		return true, nil
	}
	if fd.HasPresence() || r.GetIgnore() == validate.Ignore_IGNORE_IF_ZERO_VALUE {
		return false, nil
	}
	// An absent implicit-presence field is validated as its zero value; ask
	// protovalidate whether the zero value passes.
	parent := fd.ContainingMessage()
	fails, ok := b.zeroFails[parent.FullName()]
	if !ok {
		fails = map[protoreflect.FieldNumber]bool{}
		err := b.validator.Validate(dynamicpb.NewMessage(parent))
		var verr *protovalidate.ValidationError
		switch {
		case err == nil:
		case errors.As(err, &verr):
			for _, v := range verr.Violations {
				els := v.Proto.GetField().GetElements()
				if len(els) > 0 {
					fails[protoreflect.FieldNumber(els[0].GetFieldNumber())] = true
				}
			}
		default:
			return false, fmt.Errorf("probing zero value of %s: %w", parent.FullName(), err)
		}
		b.zeroFails[parent.FullName()] = fails
	}
	return fails[fd.Number()], nil
}

func (b *builder) list(fd protoreflect.FieldDescriptor, r *validate.FieldRules) (Schema, error) {
	rr := r.GetRepeated()
	items, err := b.singular(fd, rr.GetItems())
	if err != nil {
		return nil, err
	}
	s := Schema{"type": "array", "items": items}
	if rr == nil {
		return s, nil
	}
	if rr.HasMinItems() {
		s["minItems"] = rr.GetMinItems()
	}
	if rr.HasMaxItems() {
		s["maxItems"] = rr.GetMaxItems()
	}
	if rr.GetUnique() {
		s["uniqueItems"] = true
	}
	if r.GetRequired() && rr.GetMinItems() == 0 {
		s["minItems"] = 1
	}
	return s, nil
}

func (b *builder) mapField(fd protoreflect.FieldDescriptor, r *validate.FieldRules) (Schema, error) {
	mr := r.GetMap()
	val, err := b.singular(fd.MapValue(), mr.GetValues())
	if err != nil {
		return nil, err
	}
	key, err := b.singular(fd.MapKey(), mr.GetKeys())
	if err != nil {
		return nil, err
	}
	s := Schema{"type": "object", "additionalProperties": val}
	if pn := mapKeyNames(fd.MapKey().Kind(), key); pn != nil {
		s["propertyNames"] = pn
	}
	if mr.HasMinPairs() {
		s["minProperties"] = mr.GetMinPairs()
	}
	if mr.HasMaxPairs() {
		s["maxProperties"] = mr.GetMaxPairs()
	}
	if r.GetRequired() && mr.GetMinPairs() == 0 {
		s["minProperties"] = 1
	}
	return s, nil
}

// mapKeyNames turns a key's value schema into a propertyNames schema: keys
// are always JSON strings.
func mapKeyNames(k protoreflect.Kind, key Schema) Schema {
	switch k {
	case protoreflect.StringKind:
		delete(key, "type")
		if len(key) == 0 {
			return nil
		}
		return key
	case protoreflect.BoolKind:
		return Schema{"enum": []any{"true", "false"}}
	default:
		// Integer keys: the string branch of the 64-bit shape, or the
		// canonical decimal spelling for 32-bit keys.
		if anyOf, ok := key["anyOf"].([]any); ok {
			for _, br := range anyOf {
				if m, ok := br.(Schema); ok && m["type"] == "string" {
					return m
				}
			}
		}
		return Schema{"pattern": `^-?(0|[1-9][0-9]*)$`}
	}
}

// singular returns the schema of one value of fd (an element for lists).
func (b *builder) singular(fd protoreflect.FieldDescriptor, r *validate.FieldRules) (Schema, error) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		s := Schema{"type": "boolean"}
		if br := r.GetBool(); br != nil && br.HasConst() {
			s["const"] = br.GetConst()
		}
		return s, nil
	case protoreflect.StringKind:
		s := Schema{"type": "string"}
		if b.mode == Input {
			stringRules(s, r.GetString())
		}
		return s, nil
	case protoreflect.BytesKind:
		return Schema{"type": "string", "contentEncoding": "base64", "pattern": schema.Base64Pattern}, nil
	case protoreflect.EnumKind:
		return b.enum(fd.Enum(), r.GetEnum()), nil
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return b.messageRef(fd.Message(), r)
	default:
		return b.number(fd.Kind(), schema.ReadNumericRules(r))
	}
}

func (b *builder) enum(ed protoreflect.EnumDescriptor, er *validate.EnumRules) Schema {
	if ed.FullName() == "google.protobuf.NullValue" {
		return Schema{"type": "null"}
	}
	in := map[int32]bool{}
	for _, v := range er.GetIn() {
		in[v] = true
	}
	notIn := map[int32]bool{}
	for _, v := range er.GetNotIn() {
		notIn[v] = true
	}
	var names []any
	var lines []string
	values := ed.Values()
	for i := range values.Len() {
		v := values.Get(i)
		n := int32(v.Number())
		if b.mode == Input && ((er.HasConst() && er.GetConst() != n) || (len(in) > 0 && !in[n]) || notIn[n]) {
			continue
		}
		names = append(names, string(v.Name()))
		if d := comment(v); d != "" {
			lines = append(lines, string(v.Name())+": "+d)
		}
	}
	s := Schema{"type": "string", "enum": names}
	if names == nil {
		s["enum"] = []any{}
	}
	if len(lines) > 0 {
		s["description"] = strings.Join(lines, "\n")
	}
	return s
}

// wkt returns the schema of a well-known type, which protojson encodes
// specially.
func (b *builder) wkt(md protoreflect.MessageDescriptor, r *validate.FieldRules) (Schema, bool) {
	switch md.FullName() {
	case "google.protobuf.Timestamp":
		s := Schema{"type": "string", "format": "date-time", "pattern": schema.TimestampPattern}
		if b.mode == Input {
			s["not"] = Schema{"pattern": schema.TimestampOutOfRangePattern}
		}
		return s, true
	case "google.protobuf.Duration":
		return Schema{"type": "string", "pattern": schema.DurationPattern}, true
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
	case "google.protobuf.DoubleValue", "google.protobuf.FloatValue",
		"google.protobuf.Int64Value", "google.protobuf.UInt64Value",
		"google.protobuf.Int32Value", "google.protobuf.UInt32Value",
		"google.protobuf.BoolValue", "google.protobuf.StringValue", "google.protobuf.BytesValue":
		// A wrapper is its bare value; rules on the field apply to it.
		s, err := b.singular(md.Fields().ByName("value"), r)
		if err != nil {
			return Schema{}, true
		}
		return s, true
	}
	return nil, false
}

func stringRules(s Schema, sr *validate.StringRules) {
	if sr == nil {
		return
	}
	var allOf []any
	addPattern := func(p string) {
		if _, ok := s["pattern"]; !ok {
			s["pattern"] = p
			return
		}
		allOf = append(allOf, Schema{"pattern": p})
	}
	if sr.HasConst() {
		s["const"] = sr.GetConst()
	}
	if sr.HasLen() {
		s["minLength"], s["maxLength"] = sr.GetLen(), sr.GetLen()
	}
	if sr.HasMinLen() {
		s["minLength"] = sr.GetMinLen()
	}
	if sr.HasMaxLen() {
		s["maxLength"] = sr.GetMaxLen()
	}
	if sr.HasPattern() {
		addPattern(sr.GetPattern())
	}
	if sr.HasPrefix() {
		addPattern("^" + regexp.QuoteMeta(sr.GetPrefix()))
	}
	if sr.HasSuffix() {
		addPattern(regexp.QuoteMeta(sr.GetSuffix()) + "$")
	}
	if sr.HasContains() {
		addPattern(regexp.QuoteMeta(sr.GetContains()))
	}
	if sr.HasNotContains() {
		allOf = append(allOf, Schema{"not": Schema{"pattern": regexp.QuoteMeta(sr.GetNotContains())}})
	}
	if len(sr.GetIn()) > 0 {
		s["enum"] = stringsAny(sr.GetIn())
	}
	if len(sr.GetNotIn()) > 0 {
		allOf = append(allOf, Schema{"not": Schema{"enum": stringsAny(sr.GetNotIn())}})
	}
	switch {
	case sr.GetEmail():
		// No "format": "email": that format (RFC 5321) refuses addresses
		// protovalidate accepts, such as a..b@example.com or a local part
		// longer than 64 characters; the pattern is protovalidate's own.
		addPattern(emailPattern)
	case sr.GetUuid():
		s["format"] = "uuid"
		addPattern(uuidPattern)
	case sr.GetHostname():
		s["format"] = "hostname"
	case sr.GetIpv4():
		s["format"] = "ipv4"
	case sr.GetIpv6():
		s["format"] = "ipv6"
	case sr.GetIp():
		allOf = append(allOf, Schema{"anyOf": []any{Schema{"format": "ipv4"}, Schema{"format": "ipv6"}}})
	case sr.GetUri():
		s["format"] = "uri"
	case sr.GetUriRef():
		s["format"] = "uri-reference"
	}
	if len(allOf) > 0 {
		s["allOf"] = allOf
	}
}

func stringsAny(v []string) []any {
	out := make([]any, len(v))
	for i, s := range v {
		out[i] = s
	}
	return out
}

func (b *builder) number(k protoreflect.Kind, n schema.NumericRules) (Schema, error) {
	switch k {
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return b.float(k, n), nil
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return b.int64(k, n), nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		if b.mode == Output {
			return integer(k, schema.NumericRules{}), nil
		}
		return integer(k, n), nil
	}
	return nil, fmt.Errorf("unsupported kind %s", k)
}

// integer is the JSON-number schema of an integer kind under the rules n:
// the rules' const/in/not_in and range, and the kind's own limit on each
// side the rules leave open. A rule's bound replaces the limit on its side
// rather than standing next to it (the limit adds nothing there, and
// "minimum": -2⁶³ beside "exclusiveMinimum": 0 only misleads a reader);
// const and in leave no side open. An inverted range is an anyOf of two
// half-ranges, so the limits keep bounding its open ends.
func integer(k protoreflect.Kind, n schema.NumericRules) Schema {
	s := Schema{"type": "integer"}
	kmin, kmax := schema.KindLimits(k)
	lo, hi := n.Bounds()
	inverted := lo.Set && hi.Set && numLess(hi.Val, lo.Val)
	exact := n.Has("const") || len(n.List("in")) > 0
	if !exact && (!lo.Set || inverted) {
		s["minimum"] = json.Number(kmin.String())
	}
	if !exact && (!hi.Set || inverted) {
		s["maximum"] = json.Number(kmax.String())
	}
	applyNumeric(s, n)
	return s
}

// applyNumeric adds const/in/not_in and the range of n to a numeric schema.
func applyNumeric(s Schema, n schema.NumericRules) {
	if !n.Declared() {
		return
	}
	if n.Has("const") {
		s["const"] = numJSON(n.Get("const"))
	}
	if in := n.List("in"); len(in) > 0 {
		s["enum"] = numsJSON(in)
	}
	if notIn := n.List("not_in"); len(notIn) > 0 {
		s["not"] = Schema{"enum": numsJSON(notIn)}
	}
	lo, hi := n.Bounds()
	if lo.Set && hi.Set && numLess(hi.Val, lo.Val) {
		// protovalidate reads an inverted range as "outside [hi, lo]".
		s["anyOf"] = []any{rangeSchema(schema.Bound{}, hi), rangeSchema(lo, schema.Bound{})}
		return
	}
	for k, v := range rangeSchema(lo, hi) {
		s[k] = v
	}
}

func rangeSchema(lo, hi schema.Bound) Schema {
	s := Schema{}
	if lo.Set {
		if lo.Exclusive {
			s["exclusiveMinimum"] = numJSON(lo.Val)
		} else {
			s["minimum"] = numJSON(lo.Val)
		}
	}
	if hi.Set {
		if hi.Exclusive {
			s["exclusiveMaximum"] = numJSON(hi.Val)
		} else {
			s["maximum"] = numJSON(hi.Val)
		}
	}
	return s
}

func (b *builder) float(k protoreflect.Kind, n schema.NumericRules) Schema {
	num := Schema{"type": "number"}
	if k == protoreflect.FloatKind {
		num["minimum"], num["maximum"] = -math.MaxFloat32, math.MaxFloat32
	}
	if b.mode == Output {
		return Schema{"anyOf": []any{num, Schema{"enum": nonFinite}}}
	}
	applyNumeric(num, n)
	// Which non-finite spellings survive the rules: NaN fails every
	// comparison, infinities fail the bound on their side.
	var specials []any
	if (!n.Has("finite") || !n.Get("finite").Bool()) && !n.Has("const") && len(n.List("in")) == 0 {
		lo, hi := n.Bounds()
		inverted := lo.Set && hi.Set && numLess(hi.Val, lo.Val)
		if !lo.Set && !hi.Set {
			specials = append(specials, "NaN")
		}
		if !hi.Set || inverted {
			specials = append(specials, "Infinity")
		}
		if !lo.Set || inverted {
			specials = append(specials, "-Infinity")
		}
	}
	if len(specials) == 0 {
		return num
	}
	return Schema{"anyOf": []any{num, Schema{"type": "string", "enum": specials}}}
}

// int64 accepts a 64-bit integer as a JSON integer or as its canonical
// decimal string (the form protojson emits); the string's range is checked
// with a pattern.
func (b *builder) int64(k protoreflect.Kind, n schema.NumericRules) Schema {
	kmin, kmax := schema.KindLimits(k)
	digits := 19
	if kmin.Sign() == 0 {
		digits = 20
	}
	if b.mode == Output {
		return Schema{"type": "string", "pattern": intRangePattern(openIfLimit(kmin, kmin), openIfLimit(kmax, kmax), digits)}
	}
	num := integer(k, n)
	str := Schema{"type": "string"}
	lo, hi := n.Bounds()
	loI, hiI := kmin, kmax
	if lo.Set {
		loI = boundInt(lo, 1)
	}
	if hi.Set {
		hiI = boundInt(hi, -1)
	}
	if lo.Set && hi.Set && numLess(hi.Val, lo.Val) {
		str["pattern"] = "(?:" + intRangePattern(openIfLimit(kmin, kmin), hiI, digits) + ")|(?:" + intRangePattern(loI, openIfLimit(kmax, kmax), digits) + ")"
	} else {
		str["pattern"] = intRangePattern(openIfLimit(loI, kmin), openIfLimit(hiI, kmax), digits)
	}
	if n.Has("const") {
		str["const"] = n.Get("const").String()
	}
	if in := n.List("in"); len(in) > 0 {
		str["enum"] = numsString(in)
	}
	if notIn := n.List("not_in"); len(notIn) > 0 {
		str["not"] = Schema{"enum": numsString(notIn)}
	}
	return Schema{"anyOf": []any{num, str}}
}

// openIfLimit returns nil (an open side) when v is the kind's own limit, so
// the pattern stays short.
func openIfLimit(v, limit *big.Int) *big.Int {
	if v.Cmp(limit) == 0 {
		return nil
	}
	return v
}

// boundInt turns a bound into an inclusive integer, stepping exclusive
// bounds by step.
func boundInt(b schema.Bound, step int64) *big.Int {
	v := toBig(b.Val)
	if b.Exclusive {
		v.Add(v, big.NewInt(step))
	}
	return v
}

func toBig(v protoreflect.Value) *big.Int {
	switch x := v.Interface().(type) {
	case int32:
		return big.NewInt(int64(x))
	case int64:
		return big.NewInt(x)
	case uint32:
		return new(big.Int).SetUint64(uint64(x))
	case uint64:
		return new(big.Int).SetUint64(x)
	}
	return big.NewInt(0)
}

func numLess(a, b protoreflect.Value) bool {
	switch x := a.Interface().(type) {
	case float32:
		return x < b.Interface().(float32)
	case float64:
		return x < b.Interface().(float64)
	}
	return toBig(a).Cmp(toBig(b)) < 0
}

func numJSON(v protoreflect.Value) any {
	switch x := v.Interface().(type) {
	case float32:
		return json.Number(strconv.FormatFloat(float64(x), 'g', -1, 32))
	case float64:
		return json.Number(strconv.FormatFloat(x, 'g', -1, 64))
	}
	return json.Number(toBig(v).String())
}

func numsJSON(vs []protoreflect.Value) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		out[i] = numJSON(v)
	}
	return out
}

func numsString(vs []protoreflect.Value) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		out[i] = toBig(v).String()
	}
	return out
}

// zeroJSON is the JSON spelling of fd's zero value.
func zeroJSON(fd protoreflect.FieldDescriptor) any {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return false
	case protoreflect.StringKind, protoreflect.BytesKind:
		return ""
	case protoreflect.EnumKind:
		if v := fd.Enum().Values().ByNumber(0); v != nil {
			return string(v.Name())
		}
		return ""
	default:
		return 0
	}
}

func comment(d protoreflect.Descriptor) string {
	loc := d.ParentFile().SourceLocations().ByDescriptor(d)
	return strings.TrimSpace(strings.Join(strings.Fields(strings.ReplaceAll(loc.LeadingComments, "\n", " \n ")), " "))
}
