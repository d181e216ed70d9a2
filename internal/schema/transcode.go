package schema

import (
	"cmp"
	"encoding/base64"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// TranscodeOutput writes the JSON of the message of type md that b
// encodes, straight from its wire bytes: the bytes MarshalOutput returns
// for b decoded (proto.Unmarshal) into a dynamic message of md, without
// the forty to a hundred allocations of decoding a page of search results
// into one. ok is false when it cannot vouch for that equality, and the
// caller decodes and calls MarshalOutput as before: types MarshalOutput
// hands to protojson or that declare extension ranges, and any input that
// is malformed or merely unusual — a field with a wire type its kind does
// not have, a group, a map entry without its key or its value, invalid
// UTF-8, an out-of-range Timestamp, nesting past maxTranscodeDepth. So it
// never decides an error: the decoder does, on the same bytes.
//
// It follows the decoder's rules for what the message holds: the last
// occurrence of a scalar field wins; the occurrences of a message field
// merge; of a oneof, the member that occurs last is set, its message
// merged only from after the last occurrence of another member; repeated
// fields gather their occurrences, packed or not; a map keeps the last
// value of each key; a field without presence is set when its value is not
// the zero value (-0.0 is not zero); unknown fields are skipped.
func TranscodeOutput(md protoreflect.MessageDescriptor, b []byte) (out []byte, ok bool) {
	p := planFor(md)
	if !p.transcodes {
		return nil, false
	}
	t := transcoders.Get().(*transcoder) //nolint:forcetypeassert // the pool holds only transcoders
	defer t.release()
	t.segs = append(t.segs, b)
	if t.message(p, 0, 1, 0) != nil {
		return nil, false
	}
	return slices.Clone(t.buf), true
}

// maxTranscodeDepth bounds the nesting TranscodeOutput follows; deeper
// messages are left to the decoder, whose own limit is far higher.
const maxTranscodeDepth = 64

// transcoder holds TranscodeOutput's scratch space, reused across calls.
// The stacks hold the state of every message being written, the innermost
// last; a message refers to its part by index, since a nested message may
// grow (and so move) them.
type transcoder struct {
	buf []byte
	// occs are field occurrences, in wire order per message.
	occs []occurrence
	// segs are the encodings whose concatenation is a message: one per
	// occurrence of a message field, merged in order.
	segs [][]byte
	// ents are map entries.
	ents []mapEntry
}

// occurrence is one field of a message's encoding, known and of the wire
// type its kind has.
type occurrence struct {
	field int // index in the message's fields
	wtyp  protowire.Type
	// val is the value's encoding: the varint, the fixed-size bytes, or
	// the contents of a length-delimited field.
	val []byte
}

// mapEntry is one map entry: its key, decoded, and its value's encoding.
type mapEntry struct {
	key  int64 // a bool, a signed or (as its bits) an unsigned integer key
	skey []byte
	wtyp protowire.Type
	val  []byte
}

var transcoders = sync.Pool{New: func() any { return &transcoder{buf: make([]byte, 0, 1024)} }}

func (t *transcoder) release() {
	if cap(t.buf) > maxPooledBuffer || cap(t.occs) > maxPooledBuffer || cap(t.ents) > maxPooledBuffer {
		return
	}
	t.buf = t.buf[:0]
	clear(t.occs)
	t.occs = t.occs[:0]
	clear(t.segs)
	t.segs = t.segs[:0]
	clear(t.ents)
	t.ents = t.ents[:0]
	transcoders.Put(t)
}

// message writes the message of plan p encoded by segs[first:last].
func (t *transcoder) message(p *outputPlan, first, last, depth int) error {
	if depth > maxTranscodeDepth {
		return errOutput
	}
	if p.timestamp {
		return t.timestamp(first, last)
	}
	start := len(t.occs)
	defer func() {
		clear(t.occs[start:])
		t.occs = t.occs[:start]
	}()
	for s := first; s < last; s++ {
		if err := t.scan(p, t.segs[s]); err != nil {
			return err
		}
	}
	end := len(t.occs)
	t.buf = append(t.buf, '{')
	written := false
	for i := range p.fields {
		f := &p.fields[i]
		var err error
		switch {
		case f.fd.IsMap():
			err = t.mapField(f, i, start, end, &written, depth)
		case f.fd.IsList():
			err = t.list(f, i, start, end, &written, depth)
		default:
			err = t.singular(p, f, i, start, end, &written, depth)
		}
		if err != nil {
			return err
		}
	}
	t.buf = append(t.buf, '}')
	return nil
}

// check writes the message of type md that val encodes and takes it back
// out: for a message the decoder reads only for a later field to replace,
// to find out whether it would fail on it.
func (t *transcoder) check(md protoreflect.MessageDescriptor, val []byte, depth int) error {
	mark, seg := len(t.buf), len(t.segs)
	t.segs = append(t.segs, val)
	err := t.message(planFor(md), seg, seg+1, depth)
	t.segs[seg] = nil
	t.segs = t.segs[:seg]
	t.buf = t.buf[:mark]
	return err
}

// scan records the occurrences of b's fields, and skips its unknown ones.
func (t *transcoder) scan(p *outputPlan, b []byte) error {
	fields := p.fields
	for len(b) > 0 {
		var (
			num  protowire.Number
			wtyp protowire.Type
			val  []byte
			ok   bool
		)
		if num, wtyp, val, b, ok = nextField(b); !ok {
			return errOutput
		}
		fd := fieldByNumber(fields, num)
		if fd < 0 {
			continue // unknown: dropped, as MarshalOutput drops it
		}
		if !wireTypeFits(fields[fd].fd, wtyp) {
			return errOutput
		}
		// The decoder checks every string it reads, those a later
		// occurrence replaces included.
		if fields[fd].fd.Kind() == protoreflect.StringKind && !utf8.Valid(val) {
			return errOutput
		}
		t.occs = append(t.occs, occurrence{field: fd, wtyp: wtyp, val: val})
	}
	return nil
}

// fieldByNumber returns the index of the field numbered num, or -1.
func fieldByNumber(fields []outputField, num protowire.Number) int {
	if len(fields) > 0 {
		if fd := fields[0].fd.ContainingMessage().Fields().ByNumber(num); fd != nil {
			return fd.Index()
		}
	}
	return -1
}

// nextField splits off b's first field: its number, its wire type, its
// value's encoding (the varint, the fixed-size bytes, or the contents of a
// length-delimited field) and the rest of b. ok is false for a malformed
// field or a group.
func nextField(b []byte) (num protowire.Number, wtyp protowire.Type, val, rest []byte, ok bool) {
	num, wtyp, n := protowire.ConsumeTag(b)
	if n < 0 || num > protowire.MaxValidNumber {
		return 0, 0, nil, nil, false
	}
	b = b[n:]
	if n = consumeValue(wtyp, b); n < 0 {
		return 0, 0, nil, nil, false
	}
	val, rest = b[:n], b[n:]
	if wtyp == protowire.BytesType {
		val, _ = protowire.ConsumeBytes(val)
	}
	return num, wtyp, val, rest, true
}

// consumeValue returns the length of a value of wire type wtyp at the
// start of b, or -1: groups, which the decoder reads with rules of their
// own, included.
func consumeValue(wtyp protowire.Type, b []byte) int {
	switch wtyp {
	case protowire.VarintType:
		_, n := protowire.ConsumeVarint(b)
		return n
	case protowire.Fixed32Type:
		_, n := protowire.ConsumeFixed32(b)
		return n
	case protowire.Fixed64Type:
		_, n := protowire.ConsumeFixed64(b)
		return n
	case protowire.BytesType:
		_, n := protowire.ConsumeBytes(b)
		return n
	}
	return -1
}

// wireTypeFits reports whether a value of fd's kind comes in wtyp; a
// repeated scalar also comes packed, length-delimited.
func wireTypeFits(fd protoreflect.FieldDescriptor, wtyp protowire.Type) bool {
	want := kindWireType(fd.Kind())
	return wtyp == want || (fd.IsList() && want != protowire.BytesType && wtyp == protowire.BytesType)
}

func kindWireType(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.BoolKind, protoreflect.EnumKind, protoreflect.Int32Kind, protoreflect.Sint32Kind,
		protoreflect.Uint32Kind, protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Uint64Kind:
		return protowire.VarintType
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType
	}
	return -1 // groups: encodesFast keeps them out
}

// key writes the field's name, after a comma unless it is the first.
func (t *transcoder) key(f *outputField, written *bool) {
	if *written {
		t.buf = append(t.buf, ',')
	}
	*written = true
	t.buf = append(t.buf, f.key...)
}

// singular writes a field that is neither a list nor a map, if it is set.
func (t *transcoder) singular(p *outputPlan, f *outputField, i, start, end int, written *bool, depth int) error {
	// The occurrences that count: for a oneof member, those after the
	// last occurrence of another member, and none if one comes last.
	from, lastOcc := start, -1
	for k := start; k < end; k++ {
		switch o := t.occs[k].field; {
		case o == i:
			lastOcc = k
		case f.oneof >= 0 && p.fields[o].oneof == f.oneof:
			from, lastOcc = k+1, -1
		}
	}
	if f.fd.Kind() == protoreflect.MessageKind {
		// The decoder reads the occurrences another member replaces too,
		// and fails on what they hold as it would on the rest.
		for k := start; k < end; k++ {
			if o := t.occs[k]; o.field == i && (k < from || lastOcc < 0) {
				if err := t.check(f.fd.Message(), o.val, depth+1); err != nil {
					return err
				}
			}
		}
	}
	if lastOcc < 0 {
		return nil
	}
	if f.fd.Kind() == protoreflect.MessageKind {
		segStart := len(t.segs)
		defer func() {
			clear(t.segs[segStart:])
			t.segs = t.segs[:segStart]
		}()
		for k := from; k < end; k++ {
			if t.occs[k].field == i {
				t.segs = append(t.segs, t.occs[k].val)
			}
		}
		t.key(f, written)
		return t.message(planFor(f.fd.Message()), segStart, len(t.segs), depth+1)
	}
	o := t.occs[lastOcc]
	if !f.fd.HasPresence() && isZeroScalar(f.fd.Kind(), o.val) {
		return nil
	}
	t.key(f, written)
	var err error
	t.buf, err = appendScalar(t.buf, f.fd, o.val)
	return err
}

// isZeroScalar reports whether the value encoded by val (a scalar's wire
// value in its kind's own wire type) is its kind's zero value, which a
// field without presence does not hold. -0.0 is not zero.
func isZeroScalar(k protoreflect.Kind, val []byte) bool {
	switch kindWireType(k) {
	case protowire.VarintType:
		v, _ := protowire.ConsumeVarint(val)
		switch k {
		case protoreflect.Int32Kind, protoreflect.Uint32Kind, protoreflect.Sint32Kind, protoreflect.EnumKind:
			return uint32(v) == 0 // the decoder keeps the low 32 bits
		}
		return v == 0
	case protowire.Fixed32Type:
		v, _ := protowire.ConsumeFixed32(val)
		return v == 0
	case protowire.Fixed64Type:
		v, _ := protowire.ConsumeFixed64(val)
		return v == 0
	}
	return len(val) == 0 // strings and bytes
}

// appendScalar writes the value val encodes (in its kind's own wire type)
// as MarshalOutput writes the decoded value.
func appendScalar(b []byte, fd protoreflect.FieldDescriptor, val []byte) ([]byte, error) {
	k := fd.Kind()
	switch k {
	case protoreflect.StringKind:
		return appendJSONBytes(b, val)
	case protoreflect.BytesKind:
		b = append(b, '"')
		b = base64.StdEncoding.AppendEncode(b, val)
		return append(b, '"'), nil
	}
	var u uint64
	switch kindWireType(k) {
	case protowire.VarintType:
		u, _ = protowire.ConsumeVarint(val)
	case protowire.Fixed32Type:
		v, _ := protowire.ConsumeFixed32(val)
		u = uint64(v)
	default:
		u, _ = protowire.ConsumeFixed64(val)
	}
	switch k {
	case protoreflect.BoolKind:
		b = strconv.AppendBool(b, u != 0)
	case protoreflect.Int32Kind:
		b = strconv.AppendInt(b, int64(int32(u)), 10) //nolint:gosec // G115: the decoder keeps the low 32 bits, as this does
	case protoreflect.Sint32Kind:
		b = strconv.AppendInt(b, int64(int32(protowire.DecodeZigZag(u&math.MaxUint32))), 10) //nolint:gosec // G115: as the decoder
	case protoreflect.Sfixed32Kind:
		b = strconv.AppendInt(b, int64(int32(uint32(u))), 10) //nolint:gosec // G115: the fixed32's bits as a signed integer
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		b = strconv.AppendUint(b, uint64(uint32(u)), 10) //nolint:gosec // G115: the low 32 bits, as the decoder
	case protoreflect.Int64Kind, protoreflect.Sfixed64Kind:
		b = append(b, '"')
		b = strconv.AppendInt(b, int64(u), 10) //nolint:gosec // G115: the bits as a signed integer, as the decoder
		b = append(b, '"')
	case protoreflect.Sint64Kind:
		b = append(b, '"')
		b = strconv.AppendInt(b, protowire.DecodeZigZag(u), 10)
		b = append(b, '"')
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		b = append(b, '"')
		b = strconv.AppendUint(b, u, 10)
		b = append(b, '"')
	case protoreflect.FloatKind:
		b = appendJSONFloat(b, float64(math.Float32frombits(uint32(u))), 32) //nolint:gosec // G115: a fixed32
	case protoreflect.DoubleKind:
		b = appendJSONFloat(b, math.Float64frombits(u), 64)
	case protoreflect.EnumKind:
		n := protoreflect.EnumNumber(u) //nolint:gosec // G115: the decoder keeps the low 32 bits, as this does
		if ev := fd.Enum().Values().ByNumber(n); ev != nil {
			b = append(b, '"')
			b = append(b, ev.Name()...)
			b = append(b, '"')
		} else {
			b = strconv.AppendInt(b, int64(n), 10)
		}
	default:
		return b, errOutput
	}
	return b, nil
}

// list writes a repeated field, if it has elements.
func (t *transcoder) list(f *outputField, i, start, end int, written *bool, depth int) error {
	scalarWire := kindWireType(f.fd.Kind())
	first := true
	for k := start; k < end; k++ {
		o := t.occs[k]
		if o.field != i {
			continue
		}
		if o.wtyp == scalarWire {
			if err := t.element(f, o.val, &first, written, depth); err != nil {
				return err
			}
			continue
		}
		// Packed: the scalars one after another.
		for b := o.val; len(b) > 0; {
			n := consumeValue(scalarWire, b)
			if n < 0 {
				return errOutput
			}
			if err := t.element(f, b[:n], &first, written, depth); err != nil {
				return err
			}
			b = b[n:]
		}
	}
	if !first {
		t.buf = append(t.buf, ']')
	}
	return nil
}

// element writes one element of a list, opening the list before the first.
func (t *transcoder) element(f *outputField, val []byte, first, written *bool, depth int) error {
	if *first {
		t.key(f, written)
		t.buf = append(t.buf, '[')
		*first = false
	} else {
		t.buf = append(t.buf, ',')
	}
	if f.fd.Kind() != protoreflect.MessageKind {
		var err error
		t.buf, err = appendScalar(t.buf, f.fd, val)
		return err
	}
	seg := len(t.segs)
	t.segs = append(t.segs, val)
	err := t.message(planFor(f.fd.Message()), seg, seg+1, depth+1)
	t.segs[seg] = nil
	t.segs = t.segs[:seg]
	return err
}

// mapField writes a map, if it has entries: the last value of each key,
// keys in MarshalOutput's order.
func (t *transcoder) mapField(f *outputField, i, start, end int, written *bool, depth int) error {
	keyFd, valFd := f.fd.MapKey(), f.fd.MapValue()
	es := len(t.ents)
	defer func() {
		clear(t.ents[es:])
		t.ents = t.ents[:es]
	}()
	for k := start; k < end; k++ {
		if o := t.occs[k]; o.field == i {
			e, err := readEntry(keyFd, valFd, o.val)
			if err != nil {
				return err
			}
			t.ents = append(t.ents, e)
		}
	}
	ents := t.ents[es:]
	if len(ents) == 0 {
		return nil
	}
	var compare func(x, y mapEntry) int
	switch keyFd.Kind() {
	case protoreflect.StringKind:
		compare = func(x, y mapEntry) int { return slicesCompare(x.skey, y.skey) }
	case protoreflect.BoolKind, protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.Fixed32Kind, protoreflect.Fixed64Kind:
		compare = func(x, y mapEntry) int { return cmp.Compare(uint64(x.key), uint64(y.key)) } //nolint:gosec // G115: unsigned keys are kept as their bits
	default:
		compare = func(x, y mapEntry) int { return cmp.Compare(x.key, y.key) }
	}
	// Stable: of entries with one key, the last in the wire is the last
	// of its run, and the one the map keeps.
	slices.SortStableFunc(ents, compare)
	t.key(f, written)
	t.buf = append(t.buf, '{')
	out := 0
	for j, e := range ents {
		if j+1 < len(ents) && compare(e, ents[j+1]) == 0 {
			// Replaced by a later entry, but read by the decoder all
			// the same.
			if valFd.Kind() == protoreflect.MessageKind {
				if err := t.check(valFd.Message(), e.val, depth+1); err != nil {
					return err
				}
			}
			continue
		}
		if out > 0 {
			t.buf = append(t.buf, ',')
		}
		out++
		if err := t.mapKey(keyFd, e); err != nil {
			return err
		}
		t.buf = append(t.buf, ':')
		if valFd.Kind() == protoreflect.MessageKind {
			seg := len(t.segs)
			t.segs = append(t.segs, e.val)
			err := t.message(planFor(valFd.Message()), seg, seg+1, depth+1)
			t.segs[seg] = nil
			t.segs = t.segs[:seg]
			if err != nil {
				return err
			}
			continue
		}
		var err error
		if t.buf, err = appendScalar(t.buf, valFd, e.val); err != nil {
			return err
		}
	}
	t.buf = append(t.buf, '}')
	return nil
}

func slicesCompare(x, y []byte) int { return slices.Compare(x, y) }

// readEntry reads a map entry that holds its key and its value once each,
// of the wire types of their kinds; anything else is left to the decoder.
func readEntry(keyFd, valFd protoreflect.FieldDescriptor, b []byte) (mapEntry, error) {
	var e mapEntry
	var key []byte
	haveKey, haveVal := false, false
	for len(b) > 0 {
		num, wtyp, n := protowire.ConsumeTag(b)
		if n < 0 {
			return e, errOutput
		}
		b = b[n:]
		n = consumeValue(wtyp, b)
		if n < 0 {
			return e, errOutput
		}
		val := b[:n]
		b = b[n:]
		if wtyp == protowire.BytesType {
			val, _ = protowire.ConsumeBytes(val)
		}
		switch {
		case num == 1 && !haveKey && wtyp == kindWireType(keyFd.Kind()):
			key, haveKey = val, true
		case num == 2 && !haveVal && wtyp == kindWireType(valFd.Kind()):
			e.wtyp, e.val, haveVal = wtyp, val, true
		default:
			return e, errOutput
		}
	}
	if !haveKey || !haveVal {
		return e, errOutput
	}
	if (keyFd.Kind() == protoreflect.StringKind && !utf8.Valid(key)) || (valFd.Kind() == protoreflect.StringKind && !utf8.Valid(e.val)) {
		return e, errOutput // checked even where a later entry replaces this one
	}
	switch keyFd.Kind() {
	case protoreflect.StringKind:
		e.skey = key
		return e, nil
	case protoreflect.Fixed32Kind:
		v, _ := protowire.ConsumeFixed32(key)
		e.key = int64(v)
	case protoreflect.Sfixed32Kind:
		v, _ := protowire.ConsumeFixed32(key)
		e.key = int64(int32(v)) //nolint:gosec // G115: the fixed32's bits as a signed integer
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind:
		v, _ := protowire.ConsumeFixed64(key)
		e.key = int64(v) //nolint:gosec // G115: kept as its bits; compared as its kind says
	default:
		v, _ := protowire.ConsumeVarint(key)
		switch keyFd.Kind() {
		case protoreflect.BoolKind:
			e.key = 0
			if v != 0 {
				e.key = 1
			}
		case protoreflect.Int32Kind:
			e.key = int64(int32(v)) //nolint:gosec // G115: the decoder keeps the low 32 bits
		case protoreflect.Sint32Kind:
			e.key = int64(int32(protowire.DecodeZigZag(v & math.MaxUint32))) //nolint:gosec // G115: as the decoder
		case protoreflect.Uint32Kind:
			e.key = int64(uint32(v)) //nolint:gosec // G115: the low 32 bits, as the decoder
		case protoreflect.Sint64Kind:
			e.key = protowire.DecodeZigZag(v)
		default: // int64, uint64
			e.key = int64(v) //nolint:gosec // G115: kept as its bits; compared as its kind says
		}
	}
	return e, nil
}

// mapKey writes a key as the string MarshalOutput makes of it.
func (t *transcoder) mapKey(fd protoreflect.FieldDescriptor, e mapEntry) error {
	switch fd.Kind() {
	case protoreflect.StringKind:
		var err error
		t.buf, err = appendJSONBytes(t.buf, e.skey)
		return err
	case protoreflect.BoolKind:
		t.buf = append(t.buf, '"')
		t.buf = strconv.AppendBool(t.buf, e.key != 0)
	case protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.Fixed32Kind, protoreflect.Fixed64Kind:
		t.buf = append(t.buf, '"')
		t.buf = strconv.AppendUint(t.buf, uint64(e.key), 10) //nolint:gosec // G115: unsigned keys are kept as their bits
	default:
		t.buf = append(t.buf, '"')
		t.buf = strconv.AppendInt(t.buf, e.key, 10)
	}
	t.buf = append(t.buf, '"')
	return nil
}

// timestamp writes a google.protobuf.Timestamp encoded by segs[first:last]:
// the last seconds and nanos in the wire, unknown fields skipped.
func (t *transcoder) timestamp(first, last int) error {
	var secs, nanos int64
	for s := first; s < last; s++ {
		for b := t.segs[s]; len(b) > 0; {
			num, wtyp, val, rest, ok := nextField(b)
			if !ok {
				return errOutput
			}
			b = rest
			if num != 1 && num != 2 {
				continue
			}
			if wtyp != protowire.VarintType {
				return errOutput
			}
			v, _ := protowire.ConsumeVarint(val)
			if num == 1 {
				secs = int64(v) //nolint:gosec // G115: int64 seconds, as the decoder
			} else {
				nanos = int64(int32(v)) //nolint:gosec // G115: int32 nanos, the low 32 bits as the decoder keeps them
			}
		}
	}
	var err error
	t.buf, err = appendTimestamp(t.buf, secs, nanos)
	return err
}
