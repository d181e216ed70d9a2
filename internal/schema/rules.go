package schema

import (
	"math"
	"math/big"
	"strings"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// What the decoder and the build-time JSON Schema projection
// (internal/schema/jsonschema) read the same way, so that the schema a
// caller is shown accepts what the decoder accepts: the canonical spellings
// of the well-known types, the integer range of each kind, the numeric
// buf.validate rules and google.api.field_behavior REQUIRED.

// Canonical spellings the decoder accepts, shared with the schema so both
// agree.
const (
	// TimestampPattern is a google.protobuf.Timestamp's spelling. Seconds
	// stop at 59: protojson (time.Parse) refuses leap seconds, which the
	// date-time format allows. The offset is RFC 3339's (hours 00-23,
	// minutes 00-59), which time.Parse does not enforce.
	TimestampPattern = `^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`
	// DurationPattern is a google.protobuf.Duration's spelling.
	DurationPattern = `^-?[0-9]{1,12}(\.[0-9]{1,9})?s$`
	// Base64Pattern is a bytes field's spelling (standard or URL-safe
	// alphabet).
	Base64Pattern = `^[A-Za-z0-9+/_-]*={0,2}$`
)

// TimestampOutOfRangePattern matches the timestamps refused although they
// match TimestampPattern: year 0000, and a non-zero offset that can move
// the instant out of protojson's range (0001-01-01T00:00:00Z to
// 9999-12-31T23:59:59.999999999Z), i.e. a positive one on 0001-01-01 or a
// negative one on 9999-12-31.
const TimestampOutOfRangePattern = `^(?:0000-|0001-01-01T[0-9:.]+\+` + nonZeroOffset + `|9999-12-31T[0-9:.]+-` + nonZeroOffset + `)`

const nonZeroOffset = `(?:(?:0[1-9]|[1-9][0-9]):[0-9]{2}|00:(?:0[1-9]|[1-9][0-9]))$`

// IsWKT reports whether n is declared in google.protobuf, whose types
// protojson spells in forms of their own.
func IsWKT(n protoreflect.FullName) bool {
	return strings.HasPrefix(string(n), "google.protobuf.")
}

// KindLimits returns the smallest and the largest value of integer kind k.
func KindLimits(k protoreflect.Kind) (*big.Int, *big.Int) {
	switch k {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return big.NewInt(math.MinInt32), big.NewInt(math.MaxInt32)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return big.NewInt(0), big.NewInt(math.MaxUint32)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return big.NewInt(0), new(big.Int).SetUint64(math.MaxUint64)
	default:
		return big.NewInt(math.MinInt64), big.NewInt(math.MaxInt64)
	}
}

// FieldBehaviorRequired reports whether fd is marked
// (google.api.field_behavior) = REQUIRED.
func FieldBehaviorRequired(fd protoreflect.FieldDescriptor) bool {
	opts := fd.Options()
	if opts == nil || !proto.HasExtension(opts, annotations.E_FieldBehavior) {
		return false
	}
	fbs, _ := proto.GetExtension(opts, annotations.E_FieldBehavior).([]annotations.FieldBehavior)
	for _, fb := range fbs {
		if fb == annotations.FieldBehavior_REQUIRED {
			return true
		}
	}
	return false
}

// NumericRules is the kind-independent view of the buf.validate numeric
// rules (int32, int64, …, double), read through reflection. The zero value
// declares none.
type NumericRules struct {
	msg protoreflect.Message
}

// ReadNumericRules returns the numeric rules of r, none if r is nil or
// holds rules of another type.
func ReadNumericRules(r *validate.FieldRules) NumericRules {
	if r == nil {
		return NumericRules{}
	}
	m := r.ProtoReflect()
	od := m.Descriptor().Oneofs().ByName("type")
	fd := m.WhichOneof(od)
	if fd == nil || fd.Message() == nil {
		return NumericRules{}
	}
	switch fd.Name() {
	case "string", "bytes", "bool", "enum", "repeated", "map", "any", "duration", "timestamp", "field_mask":
		return NumericRules{}
	}
	return NumericRules{msg: m.Get(fd).Message()}
}

// Declared reports whether n holds numeric rules at all.
func (n NumericRules) Declared() bool { return n.msg != nil }

// Has reports whether the rule name (gt, in, const, …) is set.
func (n NumericRules) Has(name protoreflect.Name) bool {
	if n.msg == nil {
		return false
	}
	fd := n.msg.Descriptor().Fields().ByName(name)
	return fd != nil && n.msg.Has(fd)
}

// Get returns the value of the rule name; n must be Declared.
func (n NumericRules) Get(name protoreflect.Name) protoreflect.Value {
	return n.msg.Get(n.msg.Descriptor().Fields().ByName(name))
}

// List returns the values of the repeated rule name (in, not_in), nil if
// it is not set.
func (n NumericRules) List(name protoreflect.Name) []protoreflect.Value {
	if !n.Has(name) {
		return nil
	}
	l := n.Get(name).List()
	out := make([]protoreflect.Value, l.Len())
	for i := range l.Len() {
		out[i] = l.Get(i)
	}
	return out
}

// Bound is one side of a numeric range.
type Bound struct {
	Val       protoreflect.Value
	Exclusive bool
	Set       bool
}

// Bounds returns the lower (gt, gte) and upper (lt, lte) bounds of n.
func (n NumericRules) Bounds() (lo, hi Bound) {
	switch {
	case n.Has("gt"):
		lo = Bound{n.Get("gt"), true, true}
	case n.Has("gte"):
		lo = Bound{n.Get("gte"), false, true}
	}
	switch {
	case n.Has("lt"):
		hi = Bound{n.Get("lt"), true, true}
	case n.Has("lte"):
		hi = Bound{n.Get("lte"), false, true}
	}
	return lo, hi
}
