package schema_test

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/internal/schema"
)

// outputProtos declares every scalar kind singular, optional, repeated and
// as map keys and values, a oneof, recursion, Timestamps, and types that
// must go through protojson (a Duration, a proto2 group, required fields,
// extensions).
var outputProtos = map[string]string{
	"out.proto": `
syntax = "proto3";
package out;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";

enum Color { COLOR_UNSPECIFIED = 0; RED = 1; GREEN = 2; }

message Scalars {
  double d = 1; float f = 2; int32 i32 = 3; int64 i64 = 4; uint32 u32 = 5; uint64 u64 = 6;
  sint32 s32 = 7; sint64 s64 = 8; fixed32 f32 = 9; fixed64 f64 = 10; sfixed32 sf32 = 11;
  sfixed64 sf64 = 12; bool b = 13; string s = 14; bytes by = 15; Color e = 16;
}

message Rich {
  Scalars scalars = 1;
  optional double od = 2; optional float of = 3; optional string os = 4; optional int64 oi64 = 5;
  optional Color oe = 6; optional bool ob = 7; optional bytes oby = 8; optional uint32 ou32 = 9;
  repeated double rd = 10; repeated float rf = 11; repeated int64 ri64 = 12; repeated string rs = 13;
  repeated bytes rby = 14; repeated Color re = 15; repeated Scalars rm = 16; repeated uint64 ru64 = 17;
  repeated bool rb = 18; repeated sint32 rs32 = 19; repeated fixed32 rf32 = 20;
  map<string, string> mss = 21; map<int32, Scalars> mim = 22; map<int64, Color> mie = 23;
  map<uint32, bytes> mub = 24; map<bool, double> mbd = 25; map<uint64, int64> mui = 26;
  map<sint64, string> mss64 = 27; map<fixed32, float> mff = 28; map<sfixed64, bool> msb = 29;
  map<string, google.protobuf.Timestamp> mat = 30; map<sint32, uint32> msu = 31;
  oneof choice { string cs = 40; Scalars cm = 41; int64 ci = 42; Color ce = 43; }
  Rich child = 50; repeated Rich children = 51;
  google.protobuf.Timestamp at = 52; repeated google.protobuf.Timestamp ats = 53;
  string camelCase_name = 54 [json_name = "other"];
}

message WithDuration { google.protobuf.Duration d = 1; string s = 2; }
`,
	"out2.proto": `
syntax = "proto2";
package out2;

enum Closed { ONE = 1; TWO = 2; }

message Plain {
  optional int32 a = 1 [default = 5]; optional string s = 2 [default = "x"];
  optional Closed e = 3; repeated int32 r = 4 [packed = true]; optional Plain self = 5;
  optional double d = 6 [default = nan];
}
message Grouped { optional group G = 1 { optional int32 x = 2; } }
message Required { required int32 a = 1; optional string s = 2; }
message Extendable { optional int32 a = 1; extensions 100 to 200; }
`,
}

func compileOutputProtos(t testing.TB) []protoreflect.FileDescriptor {
	t.Helper()
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(outputProtos),
	})}
	res, err := c.Compile(t.Context(), "out.proto", "out2.proto")
	if err != nil {
		t.Fatal(err)
	}
	return []protoreflect.FileDescriptor{res[0], res[1]}
}

// wantOutput is protojson's encoding of m as the executor asked for it.
func wantOutput(t testing.TB, m proto.Message) ([]byte, error) {
	t.Helper()
	opts := protojson.MarshalOptions{UseProtoNames: true}
	opts.AllowPartial = !schema.CanLackRequired(m.ProtoReflect().Descriptor())
	b, err := opts.Marshal(m)
	if err != nil {
		return nil, err
	}
	return compact(t, b), nil
}

// compact removes the spaces protojson adds after commas at random (per
// binary, so that callers cannot depend on its bytes); MarshalOutput's
// fast path adds none, so its output is compared byte for byte.
func compact(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatalf("invalid JSON %s: %v", b, err)
	}
	return buf.Bytes()
}

func checkOutput(t testing.TB, m proto.Message) {
	t.Helper()
	want, wantErr := wantOutput(t, m)
	got, err := schema.MarshalOutput(m)
	switch {
	case wantErr != nil || err != nil:
		if wantErr == nil || err == nil || err.Error() != wantErr.Error() {
			t.Fatalf("%s: error %v, protojson's %v", m.ProtoReflect().Descriptor().FullName(), err, wantErr)
		}
	case !bytes.Equal(compact(t, got), want):
		t.Fatalf("%s:\n got %s\nwant %s", m.ProtoReflect().Descriptor().FullName(), got, want)
	}
}

// edge values per kind: zeros, signed zero, the special floats, the
// exponent-form thresholds, integer bounds, escapes and invalid UTF-8.
var (
	edgeFloats  = []float64{0, math.Copysign(0, -1), math.NaN(), math.Inf(1), math.Inf(-1), 1e21, 1e20, 999999999999999999999, 1e-7, 1e-6, 9.999999e-7, 0.1, -2.5, 123456789.125, math.MaxFloat64, math.SmallestNonzeroFloat64, math.MaxFloat32, math.SmallestNonzeroFloat32, 1.0000001, 3.4e38, 5e-324}
	edgeInts    = []int64{0, 1, -1, math.MaxInt32, math.MinInt32, math.MaxInt64, math.MinInt64, 1 << 53, -(1 << 53) - 1}
	edgeUints   = []uint64{0, 1, math.MaxUint32, math.MaxUint64, 1<<53 + 1}
	edgeStrings = []string{"", "plain", "quote\" back\\slash /", "\x00\x01\x07\b\f\n\r\t\x0b\x1f\x7f", "<html>&amp;</html>", "é日本語🙂", "\u2028\u2029", "\ufffd", "a\xffb", "\xc3", "\xed\xa0\x80"}
	edgeBytes   = [][]byte{nil, {}, {0}, {0xff, 0xfe}, []byte("hello?>"), bytes.Repeat([]byte{0xfb}, 7)}
)

// filler sets random values, drawing often from the edge values.
type filler struct {
	r       *rand.Rand
	invalid bool // whether strings may be invalid UTF-8
}

func (f *filler) pick(n int) int { return f.r.IntN(n) }

func (f *filler) scalar(fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(f.r.IntN(2) == 1)
	case protoreflect.StringKind:
		s := edgeStrings[f.pick(len(edgeStrings))]
		for !f.invalid && !isValidUTF8(s) {
			s = edgeStrings[f.pick(len(edgeStrings))]
		}
		return protoreflect.ValueOfString(s)
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes(edgeBytes[f.pick(len(edgeBytes))])
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(f.float()))
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(f.float())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(f.int())) //nolint:gosec // truncation is the point: more edge values
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(f.int())
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(f.uint())) //nolint:gosec // as above
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(f.uint())
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		if f.pick(5) == 0 {
			return protoreflect.ValueOfEnum(protoreflect.EnumNumber(f.r.Int32N(100) + 50)) // unknown number
		}
		return protoreflect.ValueOfEnum(vals.Get(f.pick(vals.Len())).Number())
	}
	panic(fd.Kind())
}

func (f *filler) float() float64 {
	if f.pick(2) == 0 {
		return edgeFloats[f.pick(len(edgeFloats))]
	}
	return math.Float64frombits(f.r.Uint64()) * []float64{1, 1e-300, 1e300}[f.pick(3)]
}

func (f *filler) int() int64 {
	if f.pick(2) == 0 {
		return edgeInts[f.pick(len(edgeInts))]
	}
	return f.r.Int64() >> f.pick(64)
}

func (f *filler) uint() uint64 {
	if f.pick(2) == 0 {
		return edgeUints[f.pick(len(edgeUints))]
	}
	return f.r.Uint64() >> f.pick(64)
}

func isValidUTF8(s string) bool { return bytes.Equal([]byte(s), bytes.ToValidUTF8([]byte(s), nil)) }

// fill sets each field of m with probability 2/3, to depth levels of
// nesting.
func (f *filler) fill(m protoreflect.Message, depth int) {
	md := m.Descriptor()
	if md.FullName() == "google.protobuf.Timestamp" {
		secs := f.r.Int64N(253402300799+62135596800+1) - 62135596800
		nanos := []int64{0, 1, 999999999, 1000000, 123000, int64(f.r.Int32N(1e9))}[f.pick(6)]
		if f.pick(20) == 0 {
			secs, nanos = []int64{253402300800, -62135596801, 0}[f.pick(3)], []int64{-1, 1e9}[f.pick(2)]
		}
		m.Set(md.Fields().ByNumber(1), protoreflect.ValueOfInt64(secs))
		m.Set(md.Fields().ByNumber(2), protoreflect.ValueOfInt32(int32(nanos))) //nolint:gosec // in range
		return
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if f.pick(3) == 0 || (fd.Message() != nil && depth <= 0) {
			continue
		}
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range f.pick(4) {
				l.Append(f.value(l.NewElement, fd, depth))
			}
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for range f.pick(5) {
				k := f.scalar(fd.MapKey()).MapKey()
				mp.Set(k, f.value(mp.NewValue, fd.MapValue(), depth))
			}
		default:
			m.Set(fd, f.value(func() protoreflect.Value { return m.NewField(fd) }, fd, depth))
		}
	}
}

func (f *filler) value(newValue func() protoreflect.Value, fd protoreflect.FieldDescriptor, depth int) protoreflect.Value {
	if fd.Message() == nil {
		return f.scalar(fd)
	}
	v := newValue()
	f.fill(v.Message(), depth-1)
	return v
}

// TestMarshalOutputMatchesProtojson compares MarshalOutput with protojson on
// random messages of every helpdesk type and of the test types, dynamic and
// generated.
func TestMarshalOutputMatchesProtojson(t *testing.T) {
	var mds []protoreflect.MessageDescriptor
	collect := func(msgs protoreflect.MessageDescriptors) {
		for i := range msgs.Len() {
			mds = append(mds, msgs.Get(i))
		}
	}
	collect(helpdeskv1.File_examples_helpdesk_v1_helpdesk_proto.Messages())
	files := compileOutputProtos(t)
	for _, fd := range files {
		collect(fd.Messages())
	}
	for _, md := range mds {
		t.Run(string(md.FullName()), func(t *testing.T) {
			f := &filler{r: rand.New(rand.NewPCG(1, uint64(len(md.FullName()))))}
			checkOutput(t, dynamicpb.NewMessage(md))
			for i := range 300 {
				f.invalid = i%10 == 9
				m := dynamicpb.NewMessage(md)
				f.fill(m, 3)
				checkOutput(t, m)
			}
		})
	}
	t.Run("generated", func(t *testing.T) {
		f := &filler{r: rand.New(rand.NewPCG(2, 2))}
		for range 200 {
			m := &helpdeskv1.ExpenseReport{}
			f.fill(m.ProtoReflect(), 3)
			checkOutput(t, m)
			r := &helpdeskv1.SearchTicketsResponse{}
			f.fill(r.ProtoReflect(), 3)
			checkOutput(t, r)
		}
	})
}

// TestMarshalOutputEdgeValues sets each edge value alone on every scalar
// field, so no case hides behind a random draw.
func TestMarshalOutputEdgeValues(t *testing.T) {
	md := compileOutputProtos(t)[0].Messages().ByName("Rich")
	scalars := md.Fields().ByName("scalars").Message()
	set := func(fd protoreflect.FieldDescriptor, v protoreflect.Value) {
		m := dynamicpb.NewMessage(md)
		s := dynamicpb.NewMessage(scalars)
		s.Set(fd, v)
		m.Set(md.Fields().ByName("scalars"), protoreflect.ValueOfMessage(s))
		checkOutput(t, m)
	}
	for i := range scalars.Fields().Len() {
		fd := scalars.Fields().Get(i)
		switch fd.Kind() {
		case protoreflect.DoubleKind:
			for _, v := range edgeFloats {
				set(fd, protoreflect.ValueOfFloat64(v))
			}
		case protoreflect.FloatKind:
			for _, v := range edgeFloats {
				set(fd, protoreflect.ValueOfFloat32(float32(v)))
			}
		case protoreflect.StringKind:
			for _, v := range edgeStrings {
				set(fd, protoreflect.ValueOfString(v))
			}
		case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
			for _, v := range edgeInts {
				set(fd, protoreflect.ValueOfInt64(v))
			}
		case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
			for _, v := range edgeUints {
				set(fd, protoreflect.ValueOfUint64(v))
			}
		}
	}
	// Every control character, escaped one by one.
	for c := range rune(0x80) {
		set(scalars.Fields().ByName("s"), protoreflect.ValueOfString(string(c)+"x"))
	}
}

// FuzzMarshalOutput decodes the fuzz bytes as a Rich message (random field
// values, nested messages, maps, unknown fields) and, when the first byte
// says so, puts the raw bytes in a string field too, for invalid UTF-8.
func FuzzMarshalOutput(f *testing.F) {
	md := compileOutputProtos(f)[0].Messages().ByName("Rich")
	seed := dynamicpb.NewMessage(md)
	(&filler{r: rand.New(rand.NewPCG(3, 3))}).fill(seed, 3)
	b, _ := proto.Marshal(seed)
	f.Add(b)
	f.Add([]byte("\x01\x02\xff"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, ok := decodeFuzz(md, data)
		if !ok {
			return
		}
		if len(data) > 0 && data[0]&1 == 1 {
			m.Set(md.Fields().ByName("os"), protoreflect.ValueOfString(string(data)))
		}
		checkOutput(t, m)
	})
}

// decodeFuzz decodes data as a dynamic message of type md. Some malformed
// map entries make proto.Unmarshal panic on a dynamic message (protobuf-go
// v1.36.12, "cannot convert nil to map key"); such inputs say nothing about
// MarshalOutput and are skipped.
func decodeFuzz(md protoreflect.MessageDescriptor, data []byte) (m *dynamicpb.Message, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	m = dynamicpb.NewMessage(md)
	return m, proto.Unmarshal(data, m) == nil
}

// searchResult is a ticket.search result as the executor holds it: a
// dynamic message decoded from the backend's reply.
func searchResult(t testing.TB) proto.Message {
	t.Helper()
	resp := &helpdeskv1.SearchTicketsResponse{NextPageToken: "cGFnZToy"}
	for i := range 5 {
		ticket := &helpdeskv1.Ticket{
			TicketId:      "T-100" + string(rune('0'+i)),
			Subject:       "Refund request for order #4412 \"urgent\"",
			CustomerEmail: "ada@example.com",
			Tags:          []string{"billing", "refund"},
		}
		ticket.CreatedAt = &timestamppb.Timestamp{Seconds: 1767225600 + int64(i)*3600, Nanos: 5e8}
		resp.Tickets = append(resp.Tickets, ticket)
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	m := dynamicpb.NewMessage(resp.ProtoReflect().Descriptor())
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMarshalOutputAllocations holds a search result's encoding to the one
// allocation of the returned slice.
func TestMarshalOutputAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates")
	}
	m := searchResult(t)
	checkOutput(t, m)
	if n := testing.AllocsPerRun(100, func() { _, _ = schema.MarshalOutput(m) }); n > 1 {
		t.Errorf("MarshalOutput of a search result: %v allocations, want at most 1", n)
	}
}

// BenchmarkMarshalOutput compares MarshalOutput with the protojson call it
// replaces, on a ticket.search result.
func BenchmarkMarshalOutput(b *testing.B) {
	m := searchResult(b)
	b.Run("protojson", func(b *testing.B) {
		b.ReportAllocs()
		opts := protojson.MarshalOptions{UseProtoNames: true, AllowPartial: true}
		for b.Loop() {
			if _, err := opts.Marshal(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("MarshalOutput", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := schema.MarshalOutput(m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
