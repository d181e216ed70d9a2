package schema

import (
	"cmp"
	"encoding/base64"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// outputJSON is how results are encoded everywhere: proto field names, so
// outputs read like inputs.
var outputJSON = protojson.MarshalOptions{UseProtoNames: true}

// MarshalOutput encodes m as protojson.MarshalOptions{UseProtoNames: true}
// does (compact form, required fields checked), without protojson's cost on
// dynamic messages: protojson collects and sorts the populated fields of
// every message it visits and boxes every value it writes, some fifty
// allocations for a page of search results, on every governed call.
//
// The output is the same JSON: the same names, presence rules, field and
// map key order, and scalar forms. Only whitespace may differ, and only
// because protojson inserts random spaces after some commas to keep callers
// from depending on its bytes. Types it does not handle itself — the
// well-known types other than Timestamp, groups, extensions, required
// fields — go through protojson whole, as does any message it finds an
// error in (invalid UTF-8, an out-of-range Timestamp), so errors are
// protojson's own.
func MarshalOutput(m proto.Message) ([]byte, error) {
	if m == nil {
		return outputJSON.Marshal(m)
	}
	r := m.ProtoReflect()
	md := r.Descriptor()
	if !r.IsValid() || !planFor(md).fast {
		opts := outputJSON
		// The required-field check always passes on a type that cannot
		// lack one, and on a dynamic message it allocates as it walks
		// every field.
		opts.AllowPartial = !CanLackRequired(md)
		return opts.Marshal(m)
	}
	e := encoders.Get().(*outputEncoder) //nolint:forcetypeassert // the pool holds only encoders
	defer e.release()
	if err := e.message(r); err != nil {
		// protojson reports the same fault in its own words.
		return outputJSON.Marshal(m)
	}
	return slices.Clone(e.buf), nil
}

// outputEncoder appends JSON to a scratch buffer that is reused across
// calls; MarshalOutput hands back a copy of exactly the encoded size.
type outputEncoder struct {
	buf  []byte
	keys []protoreflect.MapKey
}

var encoders = sync.Pool{New: func() any { return &outputEncoder{buf: make([]byte, 0, 1024)} }}

// maxPooledBuffer keeps one huge result from pinning its buffer in the pool.
const maxPooledBuffer = 64 << 10

func (e *outputEncoder) release() {
	if cap(e.buf) > maxPooledBuffer {
		return
	}
	e.buf = e.buf[:0]
	clear(e.keys)
	e.keys = e.keys[:0]
	encoders.Put(e)
}

// outputPlan is what MarshalOutput needs to know about a message type,
// worked out once per descriptor.
type outputPlan struct {
	// fast is false when the type, or one it can contain, needs protojson.
	fast bool
	// timestamp marks google.protobuf.Timestamp, written as an RFC 3339
	// string rather than as an object.
	timestamp bool
	// transcodes is fast, and moreover neither the type nor one it can
	// contain declares extension ranges: TranscodeOutput can then write
	// its JSON from the wire bytes (a decoder would look extensions up in
	// a registry).
	transcodes bool
	// fields in declaration order, protojson's order, each with its name
	// already encoded as `"name":`.
	fields []outputField
}

type outputField struct {
	fd  protoreflect.FieldDescriptor
	key string
	// oneof is the index of the field's oneof in its message, or -1.
	oneof int
}

// plans caches outputPlan by descriptor identity, as lackRequired does.
var plans sync.Map

func planFor(md protoreflect.MessageDescriptor) *outputPlan {
	if p, ok := plans.Load(md); ok {
		return p.(*outputPlan) //nolint:forcetypeassert // only plans are stored
	}
	p := &outputPlan{
		fast:      encodesFast(md, map[protoreflect.FullName]bool{}),
		timestamp: md.FullName() == timestampName,
	}
	p.transcodes = p.fast && !extendable(md, map[protoreflect.FullName]bool{})
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		key, _ := appendJSONString(nil, fd.TextName())
		f := outputField{fd: fd, key: string(append(key, ':')), oneof: -1}
		if od := fd.ContainingOneof(); od != nil {
			f.oneof = od.Index()
		}
		p.fields = append(p.fields, f)
	}
	v, _ := plans.LoadOrStore(md, p)
	return v.(*outputPlan) //nolint:forcetypeassert // only plans are stored
}

const timestampName protoreflect.FullName = "google.protobuf.Timestamp"

// encodesFast reports whether MarshalOutput can encode md and every message
// type it can contain without protojson. seen breaks recursive types.
func encodesFast(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return true
	}
	seen[md.FullName()] = true
	if md.FullName() == timestampName {
		return true
	}
	// Well-known types have their own JSON forms; required fields need
	// protojson's check; extensions (and message sets, which have them)
	// are not visited by a walk over declared fields.
	if IsWKT(md.FullName()) || CanLackRequired(md) {
		return false
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.Kind() == protoreflect.GroupKind {
			return false // named after its type, not its field
		}
		if fd.IsMap() {
			fd = fd.MapValue()
		}
		if ed := fd.Enum(); ed != nil && IsWKT(ed.FullName()) {
			return false // NullValue is written as null
		}
		if m := fd.Message(); m != nil && !encodesFast(m, seen) {
			return false
		}
	}
	return true
}

// extendable reports whether md or a message type it can contain declares
// extension ranges. seen breaks recursive types.
func extendable(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	if md.ExtensionRanges().Len() > 0 {
		return true
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsMap() {
			fd = fd.MapValue()
		}
		if m := fd.Message(); m != nil && extendable(m, seen) {
			return true
		}
	}
	return false
}

// outputError stops the fast path (errOutput is its one value);
// MarshalOutput then lets protojson say what is wrong.
type outputError struct{}

func (outputError) Error() string { return "schema: output needs protojson" }

var errOutput error = outputError{}

func (e *outputEncoder) message(m protoreflect.Message) error {
	p := planFor(m.Descriptor())
	if p.timestamp {
		return e.timestamp(m)
	}
	e.buf = append(e.buf, '{')
	first := true
	for i := range p.fields {
		f := &p.fields[i]
		if !m.Has(f.fd) {
			continue
		}
		if !first {
			e.buf = append(e.buf, ',')
		}
		first = false
		e.buf = append(e.buf, f.key...)
		var err error
		switch v := m.Get(f.fd); {
		case f.fd.IsList():
			err = e.list(v.List(), f.fd)
		case f.fd.IsMap():
			err = e.mapEntries(v.Map(), f.fd)
		default:
			err = e.singular(v, f.fd)
		}
		if err != nil {
			return err
		}
	}
	e.buf = append(e.buf, '}')
	return nil
}

func (e *outputEncoder) list(l protoreflect.List, fd protoreflect.FieldDescriptor) error {
	e.buf = append(e.buf, '[')
	for i := range l.Len() {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		if err := e.singular(l.Get(i), fd); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, ']')
	return nil
}

// mapEntries writes a map as an object, keys in protojson's order: false
// before true, numbers ascending, strings by their bytes.
func (e *outputEncoder) mapEntries(mp protoreflect.Map, fd protoreflect.FieldDescriptor) error {
	start := len(e.keys)
	mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
		e.keys = append(e.keys, k)
		return true
	})
	keys := e.keys[start:]
	defer func() { e.keys = e.keys[:start] }()
	switch fd.MapKey().Kind() {
	case protoreflect.BoolKind:
		slices.SortFunc(keys, func(x, y protoreflect.MapKey) int { return cmpBool(x.Bool(), y.Bool()) })
	case protoreflect.StringKind:
		slices.SortFunc(keys, func(x, y protoreflect.MapKey) int { return cmp.Compare(x.String(), y.String()) })
	case protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.Fixed32Kind, protoreflect.Fixed64Kind:
		slices.SortFunc(keys, func(x, y protoreflect.MapKey) int { return cmp.Compare(x.Uint(), y.Uint()) })
	default:
		slices.SortFunc(keys, func(x, y protoreflect.MapKey) int { return cmp.Compare(x.Int(), y.Int()) })
	}
	e.buf = append(e.buf, '{')
	for i, k := range keys {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		if err := e.mapKey(k, fd.MapKey()); err != nil {
			return err
		}
		e.buf = append(e.buf, ':')
		if err := e.singular(mp.Get(k), fd.MapValue()); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, '}')
	return nil
}

func cmpBool(x, y bool) int {
	switch {
	case x == y:
		return 0
	case !x:
		return -1
	default:
		return 1
	}
}

// mapKey writes a key as the string protojson makes of it.
func (e *outputEncoder) mapKey(k protoreflect.MapKey, fd protoreflect.FieldDescriptor) error {
	var err error
	switch fd.Kind() {
	case protoreflect.StringKind:
		e.buf, err = appendJSONString(e.buf, k.String())
	case protoreflect.BoolKind:
		e.buf = append(e.buf, '"')
		e.buf = strconv.AppendBool(e.buf, k.Bool())
		e.buf = append(e.buf, '"')
	case protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.Fixed32Kind, protoreflect.Fixed64Kind:
		e.buf = append(e.buf, '"')
		e.buf = strconv.AppendUint(e.buf, k.Uint(), 10)
		e.buf = append(e.buf, '"')
	default:
		e.buf = append(e.buf, '"')
		e.buf = strconv.AppendInt(e.buf, k.Int(), 10)
		e.buf = append(e.buf, '"')
	}
	return err
}

// singular writes one value in protojson's form: 64-bit integers as
// quoted decimals (JSON numbers lose precision past 2^53), enums by name
// unless the number has none, bytes as padded standard base64.
func (e *outputEncoder) singular(v protoreflect.Value, fd protoreflect.FieldDescriptor) error {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		e.buf = strconv.AppendBool(e.buf, v.Bool())
	case protoreflect.StringKind:
		var err error
		e.buf, err = appendJSONString(e.buf, v.String())
		return err
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		e.buf = strconv.AppendInt(e.buf, v.Int(), 10)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		e.buf = strconv.AppendUint(e.buf, v.Uint(), 10)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		e.buf = append(e.buf, '"')
		e.buf = strconv.AppendInt(e.buf, v.Int(), 10)
		e.buf = append(e.buf, '"')
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		e.buf = append(e.buf, '"')
		e.buf = strconv.AppendUint(e.buf, v.Uint(), 10)
		e.buf = append(e.buf, '"')
	case protoreflect.FloatKind:
		e.buf = appendJSONFloat(e.buf, v.Float(), 32)
	case protoreflect.DoubleKind:
		e.buf = appendJSONFloat(e.buf, v.Float(), 64)
	case protoreflect.BytesKind:
		e.buf = append(e.buf, '"')
		e.buf = base64.StdEncoding.AppendEncode(e.buf, v.Bytes())
		e.buf = append(e.buf, '"')
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			e.buf = append(e.buf, '"')
			e.buf = append(e.buf, ev.Name()...) // an identifier: nothing to escape
			e.buf = append(e.buf, '"')
		} else {
			e.buf = strconv.AppendInt(e.buf, int64(v.Enum()), 10)
		}
	case protoreflect.MessageKind:
		return e.message(v.Message())
	default:
		return errOutput // groups never get here: encodesFast refuses them
	}
	return nil
}

// Timestamp bounds as protojson enforces them: years 0001 to 9999.
const (
	minTimestampSeconds = -62135596800
	maxTimestampSeconds = 253402300799
	maxTimestampNanos   = 999999999
)

// timestamp writes a google.protobuf.Timestamp as protojson does: RFC 3339
// in UTC with 0, 3, 6 or 9 fractional digits.
func (e *outputEncoder) timestamp(m protoreflect.Message) error {
	fields := m.Descriptor().Fields()
	secs := m.Get(fields.ByNumber(1)).Int()
	nanos := m.Get(fields.ByNumber(2)).Int()
	var err error
	e.buf, err = appendTimestamp(e.buf, secs, nanos)
	return err
}

// appendTimestamp writes seconds and nanoseconds since the epoch as
// protojson writes a google.protobuf.Timestamp, or fails (errOutput) out
// of its range.
func appendTimestamp(b []byte, secs, nanos int64) ([]byte, error) {
	if secs < minTimestampSeconds || secs > maxTimestampSeconds || nanos < 0 || nanos > maxTimestampNanos {
		return b, errOutput
	}
	b = append(b, '"')
	start := len(b)
	b = time.Unix(secs, nanos).UTC().AppendFormat(b, "2006-01-02T15:04:05.000000000")
	// Drop trailing groups of three zeros, and the dot if all nine go.
	for range 2 {
		if n := len(b); n-start > 3 && string(b[n-3:]) == "000" {
			b = b[:n-3]
		}
	}
	if n := len(b); string(b[n-4:]) == ".000" {
		b = b[:n-4]
	}
	return append(b, 'Z', '"'), nil
}

// appendJSONFloat writes a float as protojson does, which is ECMAScript's
// Number formatting (encoding/json's too): the shortest representation
// that round-trips at the given bit size, in exponent form below 1e-6 and
// from 1e21 on, with a one-digit negative exponent kept one digit. NaN and
// the infinities, which JSON numbers cannot express, are strings.
func appendJSONFloat(b []byte, f float64, bitSize int) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(b, `"Infinity"`...)
	case math.IsInf(f, -1):
		return append(b, `"-Infinity"`...)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 {
		// Compared at the value's own precision: float32(1e21) is not 1e21.
		small, large := abs < 1e-6, abs >= 1e21
		if bitSize == 32 {
			small, large = float32(abs) < 1e-6, float32(abs) >= 1e21
		}
		if small || large {
			format = 'e'
		}
	}
	b = strconv.AppendFloat(b, f, format, -1, bitSize)
	if format == 'e' {
		// strconv writes e-07; ECMAScript writes e-7.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// appendJSONString writes s as a JSON string the way protojson does: only
// the quote, the backslash and control characters are escaped (short forms
// where JSON has them, \u00xx otherwise; no HTML escaping, U+2028 and
// U+2029 as they are). Invalid UTF-8 is an error.
func appendJSONString(b []byte, s string) ([]byte, error) {
	if !utf8.ValidString(s) {
		return b, errOutput
	}
	return appendEscaped(b, s), nil
}

// appendJSONBytes is appendJSONString for a string still in its wire bytes.
func appendJSONBytes(b, s []byte) ([]byte, error) {
	if !utf8.Valid(s) {
		return b, errOutput
	}
	return appendEscaped(b, s), nil
}

// appendEscaped writes valid UTF-8 s quoted, escaped as appendJSONString
// says; bytes of multi-byte characters are copied as they are.
func appendEscaped[S string | []byte](b []byte, s S) []byte {
	b = append(b, '"')
	i := 0
	for j := range len(s) {
		c := s[j]
		if c >= ' ' && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[i:j]...)
		b = append(b, '\\')
		switch c {
		case '"', '\\':
			b = append(b, c)
		case '\b':
			b = append(b, 'b')
		case '\f':
			b = append(b, 'f')
		case '\n':
			b = append(b, 'n')
		case '\r':
			b = append(b, 'r')
		case '\t':
			b = append(b, 't')
		default:
			b = append(b, 'u', '0', '0', hexDigit(c>>4), hexDigit(c&0xf))
		}
		i = j + 1
	}
	b = append(b, s[i:]...)
	return append(b, '"')
}

func hexDigit(d byte) byte {
	const digits = "0123456789abcdef"
	return digits[d]
}
