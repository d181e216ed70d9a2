package schema_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	"github.com/mandate-dev/mandate/internal/schema"
	"github.com/mandate-dev/mandate/internal/schema/schematest"
)

// checkTranscode compares TranscodeOutput on b with what it stands for:
// b decoded into a dynamic message, then MarshalOutput. Where it declines
// (ok false) the caller takes that path anyway, so only its answers are
// checked: each must be what the decoder and MarshalOutput make of b.
func checkTranscode(t testing.TB, md protoreflect.MessageDescriptor, b []byte) (ok bool) {
	t.Helper()
	got, ok := schema.TranscodeOutput(md, b)
	if !ok {
		return false
	}
	m := dynamicpb.NewMessage(md)
	if err := schema.Unmarshal(proto.UnmarshalOptions{}, b, m); err != nil {
		t.Fatalf("%s: transcoded %x, which does not decode: %v\n got %s", md.FullName(), b, err, got)
	}
	want, err := schema.MarshalOutput(m)
	if err != nil {
		t.Fatalf("%s: transcoded %x, which MarshalOutput fails on: %v\n got %s", md.FullName(), b, err, got)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %x\n got %s\nwant %s", md.FullName(), b, got, want)
	}
	return true
}

// mutator rewrites encodings in ways a decoder must take in its stride and
// a careless transcoder would not: fields out of order, repeated (last
// wins, messages merge, a oneof switches), dropped, unknown fields, packed
// lists unpacked, strings of invalid UTF-8, nested messages rewritten too.
type mutator struct{ r *rand.Rand }

type wireField struct {
	num  protowire.Number
	wtyp protowire.Type
	val  []byte // the value's encoding, length prefix included
}

func splitFields(b []byte) ([]wireField, bool) {
	var out []wireField
	for len(b) > 0 {
		num, wtyp, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		m := protowire.ConsumeFieldValue(num, wtyp, b[n:])
		if m < 0 {
			return nil, false
		}
		out = append(out, wireField{num, wtyp, b[n : n+m]})
		b = b[n+m:]
	}
	return out, true
}

func (mu *mutator) mutate(md protoreflect.MessageDescriptor, b []byte, depth int) []byte {
	fields, ok := splitFields(b)
	if !ok || depth > 4 {
		return b
	}
	var out []wireField
	for _, f := range fields {
		fd := md.Fields().ByNumber(f.num)
		switch {
		case mu.r.IntN(12) == 0:
			continue // dropped
		case fd != nil && fd.Kind() == protoreflect.MessageKind && !fd.IsMap() && f.wtyp == protowire.BytesType && mu.r.IntN(2) == 0:
			inner, _ := protowire.ConsumeBytes(f.val)
			f.val = protowire.AppendBytes(nil, mu.mutate(fd.Message(), inner, depth+1))
		case fd != nil && fd.IsList() && f.wtyp == protowire.BytesType && fd.Kind() != protoreflect.StringKind &&
			fd.Kind() != protoreflect.BytesKind && fd.Kind() != protoreflect.MessageKind && mu.r.IntN(2) == 0:
			// Unpacked: the elements one field each.
			packed, _ := protowire.ConsumeBytes(f.val)
			wt := map[protoreflect.Kind]protowire.Type{protoreflect.FloatKind: protowire.Fixed32Type, protoreflect.Fixed32Kind: protowire.Fixed32Type,
				protoreflect.Sfixed32Kind: protowire.Fixed32Type, protoreflect.DoubleKind: protowire.Fixed64Type,
				protoreflect.Fixed64Kind: protowire.Fixed64Type, protoreflect.Sfixed64Kind: protowire.Fixed64Type}[fd.Kind()]
			for len(packed) > 0 {
				n := protowire.ConsumeFieldValue(f.num, wt, packed)
				if n < 0 {
					break
				}
				out = append(out, wireField{f.num, wt, packed[:n]})
				packed = packed[n:]
			}
			continue
		}
		out = append(out, f)
		if mu.r.IntN(8) == 0 {
			out = append(out, out[mu.r.IntN(len(out))]) // a field again
		}
	}
	mu.r.Shuffle(len(out), func(i, j int) {
		if mu.r.IntN(3) == 0 {
			out[i], out[j] = out[j], out[i]
		}
	})
	var res []byte
	for _, f := range out {
		res = append(protowire.AppendTag(res, f.num, f.wtyp), f.val...)
	}
	switch mu.r.IntN(10) {
	case 0: // unknown fields of every wire type
		res = protowire.AppendVarint(protowire.AppendTag(res, 999, protowire.VarintType), mu.r.Uint64())
		res = protowire.AppendFixed32(protowire.AppendTag(res, 1000, protowire.Fixed32Type), mu.r.Uint32())
		res = protowire.AppendFixed64(protowire.AppendTag(res, 1001, protowire.Fixed64Type), mu.r.Uint64())
		res = protowire.AppendBytes(protowire.AppendTag(res, 1002, protowire.BytesType), []byte("\xffunknown"))
	case 1: // a string field of invalid UTF-8
		fields := md.Fields()
		for i := range fields.Len() {
			if fd := fields.Get(i); fd.Kind() == protoreflect.StringKind && !fd.IsMap() {
				res = protowire.AppendBytes(protowire.AppendTag(res, fd.Number(), protowire.BytesType), []byte("a\xffb"))
				break
			}
		}
	case 2: // truncated
		if len(res) > 0 {
			res = res[:mu.r.IntN(len(res))]
		}
	}
	return res
}

// transcodeTypes are the message types the differential tests run on:
// the helpdesk's and the test types, every scalar kind, maps, oneofs,
// Timestamps, recursion and a proto2 type among them.
func transcodeTypes(t testing.TB) []protoreflect.MessageDescriptor {
	var mds []protoreflect.MessageDescriptor
	collect := func(msgs protoreflect.MessageDescriptors) {
		for i := range msgs.Len() {
			mds = append(mds, msgs.Get(i))
		}
	}
	collect(helpdeskv1.File_examples_helpdesk_v1_helpdesk_proto.Messages())
	for _, fd := range compileOutputProtos(t) {
		collect(fd.Messages())
	}
	return mds
}

// TestTranscodeOutputMatchesDecoding checks TranscodeOutput against
// decoding and MarshalOutput on random messages of every test type, as
// encoded and rewritten (mutator). It also checks that TranscodeOutput
// answers for every plain encoding MarshalOutput encodes on its fast path,
// so that the comparison is not vacuous.
func TestTranscodeOutputMatchesDecoding(t *testing.T) {
	for _, md := range transcodeTypes(t) {
		t.Run(string(md.FullName()), func(t *testing.T) {
			seed := uint64(len(md.FullName()))
			f := &filler{r: rand.New(rand.NewPCG(4, seed))}
			mu := &mutator{r: rand.New(rand.NewPCG(5, seed))}
			transcodes := false
			answered, mutated := 0, 0
			for i := range 400 {
				m := dynamicpb.NewMessage(md)
				f.fill(m, 3)
				b, err := proto.MarshalOptions{AllowPartial: true}.Marshal(m)
				if err != nil {
					continue
				}
				plain := checkTranscode(t, md, b)
				transcodes = transcodes || plain
				if _, err := schema.MarshalOutput(m); err == nil && !plain && transcodes {
					t.Fatalf("declined a plain encoding of a type it transcodes: %x", b)
				}
				for range 3 {
					mutated++
					if checkTranscode(t, md, mu.mutate(md, b, 0)) {
						answered++
					}
				}
				_ = i
			}
			t.Logf("answered %d of %d rewritten encodings", answered, mutated)
			if transcodes && answered < mutated/10 {
				t.Errorf("answered only %d of %d rewritten encodings", answered, mutated)
			}
		})
	}
}

// TestTranscodeOutputDeclines names what TranscodeOutput leaves to the
// decoder: types MarshalOutput gives to protojson or that take extensions,
// and inputs that are malformed or unusual.
func TestTranscodeOutputDeclines(t *testing.T) {
	files := compileOutputProtos(t)
	out, out2 := files[0].Messages(), files[1].Messages()
	for _, name := range []protoreflect.Name{"Grouped", "Required", "Extendable"} {
		if _, ok := schema.TranscodeOutput(out2.ByName(name), nil); ok {
			t.Errorf("%s: transcoded", name)
		}
	}
	if _, ok := schema.TranscodeOutput(out.ByName("WithDuration"), nil); ok {
		t.Error("WithDuration: transcoded")
	}
	rich, scalars := out.ByName("Rich"), out.ByName("Scalars")
	tag := protowire.AppendTag
	for name, tc := range map[string]struct {
		md protoreflect.MessageDescriptor
		b  []byte
	}{
		"truncated varint":       {scalars, []byte{3 << 3, 0x80}},
		"field number zero":      {scalars, []byte{0, 1}},
		"group":                  {scalars, tag(nil, 99, protowire.StartGroupType)},
		"wrong wire type":        {scalars, protowire.AppendFixed32(tag(nil, 3, protowire.Fixed32Type), 1)},
		"invalid UTF-8":          {scalars, protowire.AppendBytes(tag(nil, 14, protowire.BytesType), []byte{0xff})},
		"replaced invalid UTF-8": {scalars, protowire.AppendBytes(tag(protowire.AppendBytes(tag(nil, 14, protowire.BytesType), []byte{0xff}), 14, protowire.BytesType), []byte("ok"))},
		"map entry without value": {rich, protowire.AppendBytes(tag(nil, 21, protowire.BytesType),
			protowire.AppendBytes(tag(nil, 1, protowire.BytesType), []byte("k")))},
		"timestamp out of range": {rich, protowire.AppendBytes(tag(nil, 52, protowire.BytesType),
			protowire.AppendVarint(tag(nil, 1, protowire.VarintType), 1<<40))},
		"replaced oneof message holding invalid UTF-8": {rich, protowire.AppendBytes(tag(
			protowire.AppendBytes(tag(nil, 41, protowire.BytesType), protowire.AppendBytes(tag(nil, 14, protowire.BytesType), []byte{0xff})),
			40, protowire.BytesType), []byte("ok"))},
	} {
		if got, ok := schema.TranscodeOutput(tc.md, tc.b); ok {
			t.Errorf("%s: transcoded %x to %s", name, tc.b, got)
		}
	}
	// The input the decoder panics on (schema.Unmarshal's guard).
	md, b := schematest.PanickingMap(t)
	if got, ok := schema.TranscodeOutput(md, b); ok {
		t.Errorf("a map entry with its key twice: transcoded to %s", got)
	}
	// Nesting deeper than it follows.
	deep := []byte{}
	for range 100 {
		deep = protowire.AppendBytes(tag(nil, 50, protowire.BytesType), deep)
	}
	if _, ok := schema.TranscodeOutput(rich, deep); ok {
		t.Error("transcoded 100 levels of nesting")
	}
}

// FuzzTranscodeOutput checks TranscodeOutput's answers on arbitrary bytes
// as a Rich message (every kind, maps, a oneof, recursion, Timestamps).
func FuzzTranscodeOutput(f *testing.F) {
	md := compileOutputProtos(f)[0].Messages().ByName("Rich")
	r := rand.New(rand.NewPCG(6, 6))
	fill := &filler{r: r}
	mu := &mutator{r: r}
	for range 8 {
		m := dynamicpb.NewMessage(md)
		fill.fill(m, 3)
		if b, err := proto.Marshal(m); err == nil {
			f.Add(b)
			f.Add(mu.mutate(md, b, 0))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkTranscode(t, md, data)
	})
}

// TestTranscodeOutputAllocations holds a search result's transcoding to
// the one allocation of the returned slice.
func TestTranscodeOutputAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates")
	}
	m := searchResult(t)
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	md := m.ProtoReflect().Descriptor()
	if !checkTranscode(t, md, b) {
		t.Fatal("declined a search result")
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = schema.TranscodeOutput(md, b) }); n > 1 {
		t.Errorf("TranscodeOutput of a search result: %v allocations, want at most 1", n)
	}
}
