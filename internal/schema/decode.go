package schema

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Violation is one reason an input was refused.
type Violation struct {
	// Pointer is an RFC 6901 JSON pointer into the input, using proto field
	// names; empty for the whole input or a message-level rule.
	Pointer string `json:"pointer"`
	// Rule is a stable rule id: a protovalidate rule id such as
	// `string.pattern`, or one of the `schema.*` ids of this package.
	Rule string `json:"rule"`
	// Message explains the violation without echoing the value.
	Message string `json:"message"`
}

// InvalidError is returned by Decode when the input breaks the contract.
type InvalidError struct {
	Violations []Violation
}

func (e *InvalidError) Error() string {
	parts := make([]string, 0, len(e.Violations))
	for _, v := range e.Violations {
		p := v.Pointer
		if p == "" {
			p = "/"
		}
		parts = append(parts, p+": "+v.Message+" ["+v.Rule+"]")
	}
	return "invalid input: " + strings.Join(parts, "; ")
}

// Limits bound what Decode will read.
type Limits struct {
	// MaxBytes is the largest input accepted (default 1 MiB).
	MaxBytes int
	// MaxDepth is the deepest nesting of objects and arrays (default 32).
	MaxDepth int
}

// Decoder decodes JSON command inputs into validated dynamic messages.
type Decoder struct {
	validator protovalidate.Validator
	types     *protoregistry.Types
	limits    Limits
}

// NewDecoder returns a decoder resolving Any and extension types with
// types (nil for the global registry).
func NewDecoder(types *protoregistry.Types, limits Limits) (*Decoder, error) {
	v, err := Validator()
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	if limits.MaxBytes <= 0 {
		limits.MaxBytes = 1 << 20
	}
	if limits.MaxDepth <= 0 {
		limits.MaxDepth = 32
	}
	return &Decoder{validator: v, types: types, limits: limits}, nil
}

// Decode reads input as message md. An empty input is the empty object. It
// returns *InvalidError when the input breaks the contract; any other error
// is a fault of the decoder's own setup.
func (d *Decoder) Decode(md protoreflect.MessageDescriptor, input []byte) (*dynamicpb.Message, error) {
	msg, _, err := d.DecodeArguments(md, input)
	return msg, err
}

// DecodeArguments is Decode, and returns as well the input as it parsed
// it, for Arguments.Redact: the input is read as JSON once for both.
func (d *Decoder) DecodeArguments(md protoreflect.MessageDescriptor, input []byte) (*dynamicpb.Message, Arguments, error) {
	msg, doc, err := d.decode(md, input)
	if err != nil {
		return nil, Arguments{}, err
	}
	return msg, Arguments{doc: doc, size: len(input)}, nil
}

func (d *Decoder) decode(md protoreflect.MessageDescriptor, input []byte) (*dynamicpb.Message, map[string]any, error) {
	if len(input) > d.limits.MaxBytes {
		return nil, nil, invalid("", "schema.too_large", fmt.Sprintf("input is larger than %d bytes", d.limits.MaxBytes))
	}
	input = bytes.TrimSpace(input)
	if len(input) == 0 {
		input = []byte("{}")
	}
	obj, err := parseObject(input)
	switch {
	case errors.Is(err, errSyntax):
		return nil, nil, invalid("", "schema.syntax", "input is not valid JSON")
	case errors.Is(err, errTrailing):
		return nil, nil, invalid("", "schema.syntax", "input has data after the JSON value")
	case err != nil:
		return nil, nil, invalid("", "schema.type", "input must be a JSON object")
	}
	c := checker{depthLimit: d.limits.MaxDepth}
	c.message(obj, md, "", 0)
	// A missing field_behavior=REQUIRED field does not stop decoding, so the
	// caller hears about every rule the input breaks at once; any other
	// structural violation does.
	var missing, structural []Violation
	for _, v := range c.violations {
		if v.Rule == "required" {
			missing = append(missing, v)
		} else {
			structural = append(structural, v)
		}
	}
	if len(structural) > 0 {
		return nil, nil, invalidSorted(c.violations)
	}
	msg := dynamicpb.NewMessage(md)
	// AllowPartial only skips a required-field check that cannot fail.
	opts := protojson.UnmarshalOptions{AllowPartial: !CanLackRequired(md)}
	if d.types != nil {
		opts.Resolver = d.types
	}
	if err := opts.Unmarshal(input, msg); err != nil {
		// The structural check accepts only what protojson accepts, so this
		// is a gap in the check; refuse without echoing protojson's text,
		// which can quote the input.
		return nil, nil, invalid("", "schema.decode", "input does not decode as "+string(md.FullName()))
	}
	out := missing
	if err := d.validator.Validate(msg); err != nil {
		var verr *protovalidate.ValidationError
		if !errors.As(err, &verr) {
			return nil, nil, fmt.Errorf("schema: validating %s: %w", md.FullName(), err)
		}
		for _, v := range verr.Violations {
			out = append(out, Violation{
				Pointer: pointerOf(v),
				Rule:    v.Proto.GetRuleId(),
				Message: v.Proto.GetMessage(),
			})
		}
	}
	if len(out) > 0 {
		return nil, nil, invalidSorted(out)
	}
	return msg, obj, nil
}

// invalidSorted orders violations by pointer and rule: map iteration
// visits keys in random order, and the same input must always get the same
// error.
func invalidSorted(vs []Violation) *InvalidError {
	sort.SliceStable(vs, func(i, j int) bool {
		if vs[i].Pointer != vs[j].Pointer {
			return vs[i].Pointer < vs[j].Pointer
		}
		return vs[i].Rule < vs[j].Rule
	})
	return &InvalidError{Violations: vs}
}

func invalid(ptr, rule, msg string) *InvalidError {
	return &InvalidError{Violations: []Violation{{Pointer: ptr, Rule: rule, Message: msg}}}
}

// pointerOf turns a protovalidate field path into a JSON pointer.
func pointerOf(v *protovalidate.Violation) string {
	var b strings.Builder
	for _, el := range v.Proto.GetField().GetElements() {
		b.WriteString("/" + escapePointer(el.GetFieldName()))
		switch {
		case el.HasIndex():
			b.WriteString("/" + strconv.FormatUint(el.GetIndex(), 10))
		case el.HasStringKey():
			b.WriteString("/" + escapePointer(el.GetStringKey()))
		case el.HasIntKey():
			b.WriteString("/" + strconv.FormatInt(el.GetIntKey(), 10))
		case el.HasUintKey():
			b.WriteString("/" + strconv.FormatUint(el.GetUintKey(), 10))
		case el.HasBoolKey():
			b.WriteString("/" + strconv.FormatBool(el.GetBoolKey()))
		}
	}
	if v.Proto.GetForKey() {
		// The violation is about the map key itself, which the path already
		// names.
		return b.String()
	}
	return b.String()
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// checker walks a decoded JSON document along a message descriptor and
// refuses every spelling outside the contract: unknown or aliased names,
// nulls, wrong JSON types, non-canonical scalars, two members of a oneof,
// missing field_behavior=REQUIRED fields.
type checker struct {
	violations []Violation
	depthLimit int
	tooDeep    bool
}

func (c *checker) add(ptr, rule, msg string) {
	c.violations = append(c.violations, Violation{Pointer: ptr, Rule: rule, Message: msg})
}

func (c *checker) deeper(ptr string, depth int) bool {
	if depth > c.depthLimit {
		if !c.tooDeep {
			c.tooDeep = true
			c.add(ptr, "schema.too_deep", fmt.Sprintf("input nests deeper than %d levels", c.depthLimit))
		}
		return false
	}
	return true
}

func (c *checker) message(v any, md protoreflect.MessageDescriptor, ptr string, depth int) {
	if !c.deeper(ptr, depth) {
		return
	}
	if IsWKT(md.FullName()) {
		c.wkt(v, md, ptr, depth)
		return
	}
	obj, ok := v.(map[string]any)
	if !ok {
		c.add(ptr, "schema.type", "must be an object")
		return
	}
	fields := md.Fields()
	seenOneof := map[protoreflect.FullName]string{}
	for key, val := range obj {
		p := ptr + "/" + escapePointer(key)
		fd := fields.ByName(protoreflect.Name(key))
		if fd == nil {
			c.add(p, "schema.unknown_field", fmt.Sprintf("unknown field; %s has no field with this proto name", md.Name()))
			continue
		}
		if val == nil {
			c.add(p, "schema.null", "null is not allowed; omit the field instead")
			continue
		}
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
			if other, dup := seenOneof[od.FullName()]; dup {
				first, second := other, key
				if second < first {
					first, second = second, first
				}
				c.add(ptr+"/"+escapePointer(second), "schema.oneof", fmt.Sprintf("only one of the %s fields may be set (also set: %s)", od.Name(), first))
				continue
			}
			seenOneof[od.FullName()] = key
		}
		c.field(val, fd, p, depth)
	}
	for i := range fields.Len() {
		fd := fields.Get(i)
		if _, ok := obj[string(fd.Name())]; !ok && FieldBehaviorRequired(fd) {
			c.add(ptr+"/"+string(fd.Name()), "required", "value is required")
		}
	}
}

func (c *checker) field(v any, fd protoreflect.FieldDescriptor, ptr string, depth int) {
	r := floatRules(fd)
	switch {
	case fd.IsList():
		arr, ok := v.([]any)
		if !ok {
			c.add(ptr, "schema.type", "must be an array")
			return
		}
		if !c.deeper(ptr, depth+1) {
			return
		}
		for i, el := range arr {
			p := ptr + "/" + strconv.Itoa(i)
			if el == nil {
				c.add(p, "schema.null", "null is not allowed in a list")
				continue
			}
			c.singular(el, fd, p, depth+1, r)
		}
	case fd.IsMap():
		obj, ok := v.(map[string]any)
		if !ok {
			c.add(ptr, "schema.type", "must be an object")
			return
		}
		if !c.deeper(ptr, depth+1) {
			return
		}
		for k, el := range obj {
			p := ptr + "/" + escapePointer(k)
			c.mapKey(k, fd.MapKey(), p)
			if el == nil {
				c.add(p, "schema.null", "null is not allowed as a map value")
				continue
			}
			c.singular(el, fd.MapValue(), p, depth+1, r)
		}
	default:
		c.singular(v, fd, ptr, depth, r)
	}
}

var canonicalInt = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

func (c *checker) mapKey(k string, fd protoreflect.FieldDescriptor, ptr string) {
	switch fd.Kind() {
	case protoreflect.StringKind:
	case protoreflect.BoolKind:
		if k != "true" && k != "false" {
			c.add(ptr, "schema.type", "map key must be true or false")
		}
	default:
		if !canonicalInt.MatchString(k) || !intInRange(k, fd.Kind()) {
			c.add(ptr, "schema.type", "map key must be an integer in range")
		}
	}
}

// singular checks one value of fd; r holds the rules of a float value
// (nil for other kinds).
func (c *checker) singular(v any, fd protoreflect.FieldDescriptor, ptr string, depth int, r *validate.FieldRules) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		if _, ok := v.(bool); !ok {
			c.add(ptr, "schema.type", "must be a boolean")
		}
	case protoreflect.StringKind:
		if _, ok := v.(string); !ok {
			c.add(ptr, "schema.type", "must be a string")
		}
	case protoreflect.BytesKind:
		s, ok := v.(string)
		if !ok || !validBase64(s) {
			c.add(ptr, "schema.type", "must be a base64 string")
		}
	case protoreflect.EnumKind:
		c.enum(v, fd.Enum(), ptr)
	case protoreflect.MessageKind, protoreflect.GroupKind:
		c.message(v, fd.Message(), ptr, depth+1)
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		c.float(v, fd.Kind(), ptr, r)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		switch x := v.(type) {
		case json.Number:
			if !integral(x, fd.Kind()) {
				c.add(ptr, "schema.type", "must be an integer in range")
			}
		case string:
			if !canonicalInt.MatchString(x) || !intInRange(x, fd.Kind()) {
				c.add(ptr, "schema.type", "must be an integer in range, as a number or a decimal string")
			}
		default:
			c.add(ptr, "schema.type", "must be an integer")
		}
	default: // 32-bit integers
		x, ok := v.(json.Number)
		if !ok || !integral(x, fd.Kind()) {
			c.add(ptr, "schema.type", "must be an integer in range")
		}
	}
}

func (c *checker) enum(v any, ed protoreflect.EnumDescriptor, ptr string) {
	if ed.FullName() == "google.protobuf.NullValue" {
		return // only null reaches here as a non-null value is refused below
	}
	s, ok := v.(string)
	if !ok {
		c.add(ptr, "schema.type", "must be one of the "+string(ed.Name())+" names")
		return
	}
	if ed.Values().ByName(protoreflect.Name(s)) == nil {
		c.add(ptr, "schema.enum", "is not a "+string(ed.Name())+" name")
	}
}

func (c *checker) float(v any, k protoreflect.Kind, ptr string, r *validate.FieldRules) {
	switch x := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil || math.IsInf(f, 0) || (k == protoreflect.FloatKind && math.Abs(f) > math.MaxFloat32) {
			c.add(ptr, "schema.type", "must be a number in range")
		} else if roundsOntoBound(x, k, r) {
			c.add(ptr, "schema.range", "is outside the field's range; it only rounds onto its bound")
		}
	case string:
		if x != "NaN" && x != "Infinity" && x != "-Infinity" {
			c.add(ptr, "schema.type", "must be a number, or NaN, Infinity or -Infinity")
		}
	default:
		c.add(ptr, "schema.type", "must be a number")
	}
}

func (c *checker) wkt(v any, md protoreflect.MessageDescriptor, ptr string, depth int) {
	switch md.FullName() {
	case "google.protobuf.Timestamp":
		s, ok := v.(string)
		if !ok || !validTimestamp(s) {
			c.add(ptr, "schema.format", "must be an RFC 3339 date-time, e.g. 2026-01-31T09:00:00Z")
		}
	case "google.protobuf.Duration":
		s, ok := v.(string)
		if !ok || !validDuration(s) {
			c.add(ptr, "schema.format", "must be a duration in seconds, e.g. 1.5s")
		}
	case "google.protobuf.Struct":
		if _, ok := v.(map[string]any); !ok {
			c.add(ptr, "schema.type", "must be an object")
		}
	case "google.protobuf.ListValue":
		if _, ok := v.([]any); !ok {
			c.add(ptr, "schema.type", "must be an array")
		}
	case "google.protobuf.Value":
	case "google.protobuf.FieldMask":
		if _, ok := v.(string); !ok {
			c.add(ptr, "schema.type", "must be a string of comma-separated paths")
		}
	case "google.protobuf.Empty":
		obj, ok := v.(map[string]any)
		if !ok || len(obj) > 0 {
			c.add(ptr, "schema.type", "must be an empty object")
		}
	case "google.protobuf.Any":
		obj, ok := v.(map[string]any)
		if !ok {
			c.add(ptr, "schema.type", "must be an object")
			return
		}
		if _, ok := obj["@type"].(string); !ok {
			c.add(ptr+"/@type", "schema.type", "must name the packed type")
		}
	default:
		// Wrappers hold a bare value of their "value" field.
		if fd := md.Fields().ByName("value"); fd != nil {
			c.singular(v, fd, ptr, depth, nil)
		}
	}
}

// floatRules returns the rules applying to each float value of fd (the
// field's own, its items' or its map values'), nil for other kinds.
func floatRules(fd protoreflect.FieldDescriptor) *validate.FieldRules {
	k := fd.Kind()
	if fd.IsMap() {
		k = fd.MapValue().Kind()
	}
	if k != protoreflect.FloatKind && k != protoreflect.DoubleKind {
		return nil
	}
	r, err := protovalidate.ResolveFieldRules(fd)
	if err != nil || r.GetIgnore() == validate.Ignore_IGNORE_ALWAYS {
		return nil
	}
	switch {
	case fd.IsList():
		return r.GetRepeated().GetItems()
	case fd.IsMap():
		return r.GetMap().GetValues()
	}
	return r
}

// roundsOntoBound reports whether number n lies outside an inclusive bound
// of r although it rounds onto it (e.g. -1e-400 for gte: 0), which
// protovalidate, seeing only the rounded value, would accept. The schema
// compares the number as written, and so does the decoder.
func roundsOntoBound(n json.Number, k protoreflect.Kind, r *validate.FieldRules) bool {
	nr := ReadNumericRules(r)
	if !nr.Declared() {
		return false
	}
	bits := 64
	if k == protoreflect.FloatKind {
		bits = 32 // protojson rounds to float32
	}
	f, err := strconv.ParseFloat(string(n), bits)
	if err != nil {
		return false
	}
	lo, hi := nr.Bounds()
	return (lo.Set && !lo.Exclusive && f == lo.Val.Float() && cmpExact(n, lo.Val.Float()) < 0) ||
		(hi.Set && !hi.Exclusive && f == hi.Val.Float() && cmpExact(n, hi.Val.Float()) > 0)
}

// cmpExact compares number n, exactly, with b, which n rounds to.
func cmpExact(n json.Number, b float64) int {
	if b == 0 {
		// n underflows to zero: its sign decides (no big.Rat of a huge
		// exponent).
		mant, _, _ := strings.Cut(strings.ToLower(string(n)), "e")
		switch {
		case strings.Trim(mant, "-0.") == "":
			return 0
		case strings.HasPrefix(mant, "-"):
			return -1
		}
		return 1
	}
	x, ok := new(big.Rat).SetString(string(n))
	if !ok {
		return 0
	}
	return x.Cmp(new(big.Rat).SetFloat64(b))
}

func integral(n json.Number, k protoreflect.Kind) bool {
	// Screen the magnitude first, so big.Rat never expands a huge exponent
	// (1e1000000 costs it ~100 ms): an integer of any kind is 0 or between
	// 1 and 2^64 in magnitude.
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || math.Abs(f) > 0x1p65 {
		return false
	}
	if f == 0 {
		return cmpExact(n, 0) == 0 // 0, or a non-zero number below 1
	}
	r, ok := new(big.Rat).SetString(string(n))
	if !ok || !r.IsInt() {
		return false
	}
	lo, hi := KindLimits(k)
	return r.Num().Cmp(lo) >= 0 && r.Num().Cmp(hi) <= 0
}

func intInRange(s string, k protoreflect.Kind) bool {
	v, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return false
	}
	lo, hi := KindLimits(k)
	return v.Cmp(lo) >= 0 && v.Cmp(hi) <= 0
}

var (
	timestampRe = regexp.MustCompile(TimestampPattern)
	durationRe  = regexp.MustCompile(DurationPattern)
	base64Re    = regexp.MustCompile(Base64Pattern)

	// Matched timestamps are refused.
	timestampOutOfRangeRe = regexp.MustCompile(TimestampOutOfRangePattern)
)

func validTimestamp(s string) bool {
	if !timestampRe.MatchString(s) || timestampOutOfRangeRe.MatchString(s) {
		return false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return false
	}
	return t.Year() >= 1 && t.Year() <= 9999
}

func validDuration(s string) bool {
	if !durationRe.MatchString(s) {
		return false
	}
	f, err := strconv.ParseFloat(strings.TrimSuffix(s, "s"), 64)
	return err == nil && math.Abs(f) <= 315576000000
}

func validBase64(s string) bool {
	if !base64Re.MatchString(s) {
		return false
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		if _, err := enc.DecodeString(s); err == nil {
			return true
		}
	}
	return false
}
