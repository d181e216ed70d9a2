package jsonschema_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/big"
	"math/rand/v2"
	"regexp/syntax"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"buf.build/go/protovalidate"
	jsonschemav6 "github.com/santhosh-tekuri/jsonschema/v6"
	"google.golang.org/protobuf/reflect/protoreflect"

	helpdeskv1 "github.com/mandate-dev/mandate/gen/examples/helpdesk/v1"
	genmanifest "github.com/mandate-dev/mandate/gen/manifest"
	"github.com/mandate-dev/mandate/internal/schema"
	"github.com/mandate-dev/mandate/internal/schema/jsonschema"
)

// TestSchemaValidatorAgreement checks that the input JSON Schema of every
// helpdesk command accepts exactly what Decoder.Decode accepts. It builds a
// deterministic corpus per message — the manifest's declared examples,
// hand-written valid inputs and randomly generated valid inputs, each put
// through 0–3 mutations chosen by walking the message descriptor — and
// requires the two verdicts to match on every instance.
func TestSchemaValidatorAgreement(t *testing.T) {
	const (
		wantInstances = 600
		minValid      = 50
		minInvalid    = 100
		maxAttempts   = 10000
		maxReports    = 25 // mismatches printed per message
	)
	msgs := []protoreflect.MessageDescriptor{
		(&helpdeskv1.SearchTicketsRequest{}).ProtoReflect().Descriptor(),
		(&helpdeskv1.GetTicketRequest{}).ProtoReflect().Descriptor(),
		(&helpdeskv1.IssueRefundRequest{}).ProtoReflect().Descriptor(),
		(&helpdeskv1.CreateExpenseReportRequest{}).ProtoReflect().Descriptor(),
		(&helpdeskv1.SubmitExpenseReportRequest{}).ProtoReflect().Descriptor(),
		(&helpdeskv1.RecallExpenseReportRequest{}).ProtoReflect().Descriptor(),
		(&helpdeskv1.ApproveExpenseReportRequest{}).ProtoReflect().Descriptor(),
	}
	examples := manifestExamples(t)
	dec, err := schema.NewDecoder(nil, schema.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for _, md := range msgs {
		name := string(md.Name())
		sch := compileInputSchema(t, md)
		seeds := append(slices.Clone(examples[md.FullName()]), handSeeds(t, md.Name())...)
		if len(examples[md.FullName()]) == 0 {
			t.Errorf("%s: the manifest declares no example input", name)
		}

		for i, seed := range seeds {
			data, _ := json.Marshal(seed)
			if _, err := dec.Decode(md, data); err != nil {
				t.Errorf("%s: seed %d %s is refused by the decoder: %v", name, i, data, err)
			}
		}

		h := fnv.New64a()
		h.Write([]byte(md.FullName()))
		g := &gen{r: rand.New(rand.NewPCG(20260131, h.Sum64())), rules: map[protoreflect.FullName]*validate.FieldRules{}}

		seen := map[string]bool{}
		var valid, invalid, mismatches int
		rules := map[string]int{}
		for attempt := 0; attempt < maxAttempts && (len(seen) < wantInstances || valid < minValid+10 || invalid < minInvalid+20); attempt++ {
			var inst any
			var trail []string
			if i := g.r.IntN(2 * len(seeds)); i < len(seeds) {
				inst = clone(seeds[i])
				trail = append(trail, fmt.Sprintf("seed %d", i))
			} else {
				inst = g.validMessage(md, 0)
				trail = append(trail, "generated")
			}
			for range g.r.IntN(4) {
				var what string
				inst, what = g.mutate(inst, md)
				trail = append(trail, what)
			}
			data, err := json.Marshal(inst)
			if err != nil {
				t.Fatalf("%s: marshal %#v: %v", name, inst, err)
			}
			if seen[string(data)] {
				continue
			}
			seen[string(data)] = true

			doc, err := jsonschemav6.UnmarshalJSON(bytes.NewReader(data))
			if err != nil {
				t.Fatalf("%s: %s: %v", name, data, err)
			}
			schemaErr := sch.Validate(doc)
			_, decErr := dec.Decode(md, data)
			var inv *schema.InvalidError
			if decErr != nil && !errors.As(decErr, &inv) {
				t.Fatalf("%s: Decode(%s) failed with a non-contract error: %v", name, data, decErr)
			}
			a, b := schemaErr == nil, decErr == nil
			if b {
				valid++
			} else {
				invalid++
				for _, v := range inv.Violations {
					rules[v.Rule]++
				}
			}
			if a != b {
				mismatches++
				if mismatches <= maxReports {
					t.Errorf("%s: schema and decoder disagree\n  instance: %s\n  built by: %s\n  schema valid: %v\n  schema errors: %v\n  decoder valid: %v\n  decoder errors: %v",
						name, data, strings.Join(trail, "; "), a, indent(schemaErr), b, decErr)
				}
			}
		}
		if mismatches > maxReports {
			t.Errorf("%s: %d disagreements in all (%d shown)", name, mismatches, maxReports)
		}
		t.Logf("%-28s %d instances: %d valid, %d invalid, %d disagreements; decoder rules hit: %v", name, len(seen), valid, invalid, mismatches, sortedCounts(rules))
		if len(seen) < 300 || valid < minValid || invalid < minInvalid {
			t.Errorf("%s: corpus too small: %d instances, %d valid (want ≥ %d), %d invalid (want ≥ %d)", name, len(seen), valid, minValid, invalid, minInvalid)
		}
	}
}

func indent(err error) string {
	if err == nil {
		return "<nil>"
	}
	return strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "\n    ")
}

func sortedCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

// compileInputSchema builds md's input schema and compiles it with format
// assertions on and the default (Go regexp) engine.
func compileInputSchema(t *testing.T, md protoreflect.MessageDescriptor) *jsonschemav6.Schema {
	t.Helper()
	s, err := jsonschema.Build(md, jsonschema.Input)
	if err != nil {
		t.Fatalf("Build(%s): %v", md.FullName(), err)
	}
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschemav6.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschemav6.NewCompiler()
	c.AssertFormat()
	url := "https://schemas.mandate.invalid/" + string(md.FullName()) + ".json"
	if err := c.AddResource(url, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		t.Fatalf("compiling the schema of %s: %v\n%s", md.FullName(), err, raw)
	}
	return sch
}

// manifestExamples returns the declared example inputs of every command,
// by input message.
func manifestExamples(t *testing.T) map[protoreflect.FullName][]any {
	t.Helper()
	var m struct {
		Commands []struct {
			RPC struct {
				InputType string `json:"input_type"`
			} `json:"rpc"`
			Examples []struct {
				Input json.RawMessage `json:"input"`
			} `json:"examples"`
		} `json:"commands"`
	}
	if err := json.Unmarshal(genmanifest.Manifest, &m); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	out := map[protoreflect.FullName][]any{}
	for _, c := range m.Commands {
		for _, ex := range c.Examples {
			n := protoreflect.FullName(c.RPC.InputType)
			out[n] = append(out[n], parseJSON(t, string(ex.Input)))
		}
	}
	return out
}

func parseJSON(t *testing.T, s string) any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("seed %s: %v", s, err)
	}
	return v
}

// handSeeds are valid inputs exercising the optional fields and the
// alternative spellings the contract allows.
func handSeeds(t *testing.T, name protoreflect.Name) []any {
	var src []string
	switch name {
	case "SearchTicketsRequest":
		src = []string{
			`{}`,
			`{"customer_email": "ana.lopez@example.com"}`,
			`{"query": "refund", "statuses": ["TICKET_STATUS_OPEN", "TICKET_STATUS_PENDING", "TICKET_STATUS_CLOSED"], "tags": ["vip", "billing-2"], "created_after": "2026-01-31T09:00:00Z", "page_size": 100, "page_token": "abc"}`,
			`{"created_after": "2026-01-31T09:00:00.123456789+02:00", "page_size": 1, "customer_email": "first.last+tag@sub.example.co"}`,
			`{"tags": ["a", "0123456789-abcdefghij-0123456789"], "query": "ünïcödé ☃ 😀", "created_after": "1999-12-31T23:59:59.5-05:30"}`,
		}
	case "GetTicketRequest":
		src = []string{`{"ticket_id": "T-1234567890"}`, `{"ticket_id": "T-0000"}`}
	case "IssueRefundRequest":
		src = []string{
			`{"ticket_id": "T-1001", "amount": {"currency_code": "EUR", "amount_minor": 2500}, "reason": "Charged twice", "cardholder_reference": "CH4242424242"}`,
			`{"ticket_id": "T-99999", "amount": {"currency_code": "USD", "amount_minor": "100000000"}, "cardholder_reference": "ABCDEFGH", "reason": "abc"}`,
			`{"ticket_id": "T-1001", "amount": {"currency_code": "JPY", "amount_minor": "1"}, "reason": "Remboursé ✓", "cardholder_reference": "0123456789ABCDEF0123456789ABCDEF"}`,
		}
	case "CreateExpenseReportRequest":
		src = []string{
			`{"title": "Hotel", "lines": [{"description": "Two nights", "amount": {"currency_code": "EUR", "amount_minor": "24000"}, "category": "EXPENSE_CATEGORY_LODGING"}], "bank_account_alias": "main account"}`,
			`{"title": "Road trip", "lines": [{"description": "Mileage", "amount": {"currency_code": "EUR", "amount_minor": 12345}, "category": "EXPENSE_CATEGORY_TRAVEL", "distance_km": 412.5}, {"description": "Lunch", "amount": {"currency_code": "EUR", "amount_minor": "1850"}, "category": "EXPENSE_CATEGORY_MEALS", "distance_km": 0}], "labels": {"project": "atlas", "cost_center": "cc_42"}, "payroll_id": "P-0042"}`,
			`{"title": "Misc", "lines": [{"description": "Cables", "amount": {"currency_code": "GBP", "amount_minor": 999}, "category": "EXPENSE_CATEGORY_OTHER", "distance_km": 10000}], "labels": {}, "bank_account_alias": "x"}`,
		}
	case "SubmitExpenseReportRequest":
		src = []string{`{"report_id": "ER-2001"}`, `{"report_id": "ER-1234567890", "note": "Reçus joints ✓"}`}
	case "RecallExpenseReportRequest":
		src = []string{`{"report_id": "ER-2002"}`, `{"report_id": "ER-0000", "reason": ""}`}
	case "ApproveExpenseReportRequest":
		src = []string{`{"report_id": "ER-2003"}`, `{"report_id": "ER-2003", "comment": "Approuvé 👍"}`}
	}
	out := make([]any, len(src))
	for i, s := range src {
		out[i] = parseJSON(t, s)
	}
	return out
}

func clone(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = clone(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = clone(e)
		}
		return l
	}
	return v
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// gen generates instances from a fixed-seed PCG source.
type gen struct {
	r     *rand.Rand
	rules map[protoreflect.FullName]*validate.FieldRules
}

func (g *gen) pick(n int) int { return g.r.IntN(n) }

func (g *gen) chance(pct int) bool { return g.r.IntN(100) < pct }

// fieldRules returns fd's buf.validate rules (never nil).
func (g *gen) fieldRules(fd protoreflect.FieldDescriptor) *validate.FieldRules {
	if r, ok := g.rules[fd.FullName()]; ok {
		return r
	}
	r, err := protovalidate.ResolveFieldRules(fd)
	if err != nil || r == nil {
		r = &validate.FieldRules{}
	}
	g.rules[fd.FullName()] = r
	return r
}

// slot is one singular value position: a field, a list item or a map
// value, with the rules that apply to it.
type slot struct {
	fd protoreflect.FieldDescriptor // kind, enum and message of the value
	r  *validate.FieldRules
}

func (g *gen) itemSlot(fd protoreflect.FieldDescriptor) slot {
	r := g.fieldRules(fd)
	switch {
	case fd.IsList():
		return slot{fd, orEmpty(r.GetRepeated().GetItems())}
	case fd.IsMap():
		return slot{fd.MapValue(), orEmpty(r.GetMap().GetValues())}
	}
	return slot{fd, r}
}

func orEmpty(r *validate.FieldRules) *validate.FieldRules {
	if r == nil {
		return &validate.FieldRules{}
	}
	return r
}

// ---------------------------------------------------------------------------
// Valid values

var emailRe = mustParse("^[a-zA-Z0-9.!#$%&'*+/=?^_`{|}~-]+@[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(?:\\.[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$")

func mustParse(p string) *syntax.Regexp {
	re, err := syntax.Parse(p, syntax.Perl)
	if err != nil {
		panic(err)
	}
	return re
}

// matching returns a random string matched by re.
func (g *gen) matching(re *syntax.Regexp) string {
	var sb strings.Builder
	g.walkRe(re, &sb)
	return sb.String()
}

func (g *gen) walkRe(re *syntax.Regexp, sb *strings.Builder) {
	repeat := func(lo, hi int) {
		n := lo
		switch {
		case hi < 0:
			n = lo + g.pick(4)
		case hi > lo && g.chance(20):
			n = hi
		case hi > lo:
			n = lo + g.pick(hi-lo+1)
		}
		for range n {
			g.walkRe(re.Sub[0], sb)
		}
	}
	switch re.Op {
	case syntax.OpLiteral:
		for _, c := range re.Rune {
			sb.WriteRune(c)
		}
	case syntax.OpCharClass:
		i := g.pick(len(re.Rune) / 2)
		lo, hi := re.Rune[2*i], re.Rune[2*i+1]
		if hi-lo > 0x2000 {
			hi = lo + 0x2000
		}
		c := lo + rune(g.pick(int(hi-lo)+1))
		if !utf8.ValidRune(c) {
			c = lo
		}
		sb.WriteRune(c)
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		sb.WriteByte('x')
	case syntax.OpCapture:
		g.walkRe(re.Sub[0], sb)
	case syntax.OpConcat:
		for _, s := range re.Sub {
			g.walkRe(s, sb)
		}
	case syntax.OpAlternate:
		g.walkRe(re.Sub[g.pick(len(re.Sub))], sb)
	case syntax.OpStar:
		repeat(0, 3)
	case syntax.OpPlus:
		repeat(1, 6)
	case syntax.OpQuest:
		repeat(0, 1)
	case syntax.OpRepeat:
		repeat(re.Min, re.Max)
	}
}

var textRunes = []rune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_.,;:!?'\"\\/<>&éüßçøΩЖ日本語☃✓😀👍\t\n\u0000\u200b")

func (g *gen) text(n int) string {
	var sb strings.Builder
	for range n {
		sb.WriteRune(textRunes[g.pick(len(textRunes))])
	}
	return sb.String()
}

func (g *gen) validString(sr *validate.StringRules) string {
	lo, hi := 0, 40
	if sr.HasMinLen() {
		lo = int(sr.GetMinLen())
	}
	if sr.HasMaxLen() {
		hi = int(sr.GetMaxLen())
	}
	var re *syntax.Regexp
	switch {
	case sr.GetEmail():
		re = emailRe
	case sr.HasPattern():
		re = mustParse(sr.GetPattern())
	}
	if re != nil {
		for range 20 {
			s := g.matching(re)
			if n := utf8.RuneCountInString(s); n >= lo && n <= hi {
				return s
			}
		}
		return g.matching(re)
	}
	var n int
	switch {
	case g.chance(15):
		n = hi
	case g.chance(15):
		n = lo
	default:
		n = lo + g.pick(min(hi-lo, 24)+1)
	}
	return g.text(n)
}

// intBounds returns the inclusive range of an integer slot.
func intBounds(s slot) (lo, hi int64) {
	lo, hi = -1000, 1000
	switch s.fd.Kind() {
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		ir := s.r.GetInt32()
		if ir.HasGt() {
			lo = int64(ir.GetGt()) + 1
		}
		if ir.HasGte() {
			lo = int64(ir.GetGte())
		}
		if ir.HasLt() {
			hi = int64(ir.GetLt()) - 1
		}
		if ir.HasLte() {
			hi = int64(ir.GetLte())
		}
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		ir := s.r.GetInt64()
		if ir.HasGt() {
			lo = ir.GetGt() + 1
		}
		if ir.HasGte() {
			lo = ir.GetGte()
		}
		if ir.HasLt() {
			hi = ir.GetLt() - 1
		}
		if ir.HasLte() {
			hi = ir.GetLte()
		}
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		lo = 0
	}
	return lo, hi
}

func floatBounds(s slot) (lo, hi float64) {
	lo, hi = -1e6, 1e6
	if dr := s.r.GetDouble(); dr != nil {
		if dr.HasGte() {
			lo = dr.GetGte()
		}
		if dr.HasGt() {
			lo = dr.GetGt()
		}
		if dr.HasLte() {
			hi = dr.GetLte()
		}
		if dr.HasLt() {
			hi = dr.GetLt()
		}
	}
	return lo, hi
}

func is64(k protoreflect.Kind) bool {
	switch k {
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return true
	}
	return false
}

func num(s string) json.Number { return json.Number(s) }

func (g *gen) allowedEnumNames(s slot) []string {
	er := s.r.GetEnum()
	var out []string
	values := s.fd.Enum().Values()
	for i := range values.Len() {
		n := int32(values.Get(i).Number())
		if er.HasConst() && er.GetConst() != n || len(er.GetIn()) > 0 && !slices.Contains(er.GetIn(), n) || slices.Contains(er.GetNotIn(), n) {
			continue
		}
		out = append(out, string(values.Get(i).Name()))
	}
	return out
}

func (g *gen) validTimestamp() string {
	y := 1 + g.pick(9999)
	if g.chance(70) {
		y = 1970 + g.pick(100)
	}
	ts := fmt.Sprintf("%04d-%02d-%02dT%02d:%02d:%02d", y, 1+g.pick(12), 1+g.pick(28), g.pick(24), g.pick(60), g.pick(60))
	if g.chance(40) {
		ts += "." + strconv.Itoa(g.pick(10))[:1] + strings.Repeat("5", g.pick(9))
	}
	if g.chance(60) || y == 1 || y == 9999 {
		return ts + "Z"
	}
	sign := "+-"[g.pick(2)]
	return ts + fmt.Sprintf("%c%02d:%02d", sign, g.pick(24), 15*g.pick(4))
}

// validValue returns a value of slot s that keeps its rules.
func (g *gen) validValue(s slot, depth int) any {
	switch s.fd.Kind() {
	case protoreflect.BoolKind:
		return g.chance(50)
	case protoreflect.StringKind:
		return g.validString(s.r.GetString())
	case protoreflect.BytesKind:
		b := make([]byte, g.pick(12))
		for i := range b {
			b[i] = byte(g.pick(256))
		}
		return base64.StdEncoding.EncodeToString(b)
	case protoreflect.EnumKind:
		names := g.allowedEnumNames(s)
		return names[g.pick(len(names))]
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		lo, hi := floatBounds(s)
		switch g.pick(4) {
		case 0:
			return num(strconv.FormatFloat(lo, 'g', -1, 64))
		case 1:
			return num(strconv.FormatFloat(hi, 'g', -1, 64))
		}
		return num(strconv.FormatFloat(lo+g.r.Float64()*(hi-lo), 'g', -1, 64))
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if s.fd.Message().FullName() == "google.protobuf.Timestamp" {
			return g.validTimestamp()
		}
		return g.validMessage(s.fd.Message(), depth+1)
	}
	lo, hi := intBounds(s)
	var v int64
	switch g.pick(5) {
	case 0:
		v = lo
	case 1:
		v = hi
	default:
		v = lo + g.r.Int64N(hi-lo+1)
	}
	if is64(s.fd.Kind()) && g.chance(50) {
		return strconv.FormatInt(v, 10)
	}
	return num(strconv.FormatInt(v, 10))
}

// validField returns a valid value for the whole field fd.
func (g *gen) validField(fd protoreflect.FieldDescriptor, depth int) any {
	r := g.fieldRules(fd)
	switch {
	case fd.IsList():
		rr := r.GetRepeated()
		lo, hi := int(rr.GetMinItems()), 3
		if rr.HasMaxItems() {
			hi = min(hi, int(rr.GetMaxItems()))
		}
		n := lo + g.pick(max(hi-lo, 0)+1)
		return g.list(fd, n, rr.GetUnique(), depth)
	case fd.IsMap():
		m := map[string]any{}
		for range g.pick(4) {
			m[g.validKey(fd)] = g.validValue(g.itemSlot(fd), depth)
		}
		return m
	}
	return g.validValue(slot{fd, r}, depth)
}

// list returns n valid items of list fd, distinct when unique (as far as
// the item type allows).
func (g *gen) list(fd protoreflect.FieldDescriptor, n int, unique bool, depth int) []any {
	s := g.itemSlot(fd)
	out := []any{}
	seen := map[string]bool{}
	for tries := 0; len(out) < n && tries < 20*n+20; tries++ {
		v := g.validValue(s, depth)
		k, _ := json.Marshal(v)
		if unique && seen[string(k)] {
			continue
		}
		seen[string(k)] = true
		out = append(out, v)
	}
	return out
}

func (g *gen) validKey(fd protoreflect.FieldDescriptor) string {
	kr := orEmpty(g.fieldRules(fd).GetMap().GetKeys())
	switch fd.MapKey().Kind() {
	case protoreflect.StringKind:
		return g.validString(kr.GetString())
	case protoreflect.BoolKind:
		return strconv.FormatBool(g.chance(50))
	}
	return strconv.Itoa(g.pick(1000))
}

// validMessage returns a random valid object of md: required fields and
// implicit-presence scalars always, optional ones at random, one member of
// each oneof.
func (g *gen) validMessage(md protoreflect.MessageDescriptor, depth int) map[string]any {
	obj := map[string]any{}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
			continue
		}
		r := g.fieldRules(fd)
		must := r.GetRequired() || r.GetRepeated().GetMinItems() > 0 ||
			(!fd.HasPresence() && !fd.IsList() && !fd.IsMap())
		if must || (depth < 3 && g.chance(50)) {
			obj[string(fd.Name())] = g.validField(fd, depth)
		}
	}
	oneofs := md.Oneofs()
	for i := range oneofs.Len() {
		od := oneofs.Get(i)
		if od.IsSynthetic() {
			continue
		}
		fd := od.Fields().Get(g.pick(od.Fields().Len()))
		obj[string(fd.Name())] = g.validField(fd, depth)
	}
	return obj
}

// ---------------------------------------------------------------------------
// Invalid and edge values

var wrongTypes = []any{"x", num("1"), true, map[string]any{}, []any{}, nil}

func (g *gen) wrongType() any { return clone(wrongTypes[g.pick(len(wrongTypes))]) }

var (
	badStrings = []string{
		"", strings.Repeat("a", 600), "ünïcödé ☃ 日本語 😀", "not-an-email", "yesterday", "T-1", "eur",
		"2026-13-45T00:00:00Z", "T-1001", "T-12345678901", "ER-2001", "ER-12", "P-0042", "P-42", "EUR", "EURO",
		"CH4242424242", "ch4242424242", "T-1001\n", " T-1001", "vip", "VIP", "a b", "\u0000", "😀",
	}
	badEmails = []string{
		"not-an-email", "a..b@example.com", ".a@example.com", "a.@example.com", "user@localhost",
		"user@-example.com", "user@example-.com", "user@example.com.", `"q"@example.com`, "user@[127.0.0.1]",
		"UsEr@ExAmPlE.CoM", "ünï@example.com", "a@b", strings.Repeat("l", 65) + "@example.com",
		"x@" + strings.Repeat(strings.Repeat("d", 63)+".", 4) + "com", "user@" + strings.Repeat("d", 64) + ".com",
		"@example.com", "user@", "user@@example.com", "us er@example.com",
	}
	badTimestamps = []string{
		"yesterday", "2026-13-45T00:00:00Z", "2026-02-29T00:00:00Z", "2024-02-29T00:00:00Z", "2026-06-30T23:59:60Z",
		"2026-06-30T23:59:60.5Z", "2026-07-01T01:59:60+02:00", "0000-01-01T00:00:00Z", "0001-01-01T00:00:00Z",
		"0001-01-01T00:00:00+01:00", "0001-01-01T00:59:59+01:00", "0001-01-01T05:00:00+01:00",
		"0001-01-01T00:00:00-01:00", "0001-01-01T00:00:00+00:00", "9999-12-31T23:59:59Z",
		"9999-12-31T23:59:59.999999999Z", "9999-12-31T23:59:59-01:00", "9999-12-31T22:00:00-01:00",
		"9999-12-31T23:00:00-00:00", "2026-01-31t09:00:00z", "2026-01-31 09:00:00Z", "2026-01-31T09:00:00",
		"2026-01-31T09:00:00.1234567890Z", "2026-01-31T24:00:00Z", "2026-01-31T09:60:00Z",
		"2026-01-31T09:00:00+24:00", "2026-01-31T09:00:00+02:60", "2026-01-31T09:00:00+0200", "2026-01-31T09:00:00.Z",
		"+2026-01-31T09:00:00Z", "12026-01-31T09:00:00Z", "2026-1-31T09:00:00Z", "2026-01-31T09:00:00Z ",
		"2026-01-31T09:00:00+02:00", "2026-04-31T00:00:00Z", "١٢٣٤-01-31T09:00:00Z",
	}
	badEnums    = []any{"UNKNOWN_VALUE", "", num("1"), "1", num("0")}
	badMapKeys  = []string{"", "Project", "1abc", "with space", "a-b", "_x", strings.Repeat("a", 32), strings.Repeat("a", 33), "ünï", "project"}
	badInt64Str = []string{"2500", "-5", "007", "1e2", "2500.0", "", " 2500", "2500 ", "+5", "0x10", "-0", "0",
		"9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809", "1_000", "١٢٣"}
	badNumbers = []string{"0", "-0", "-1", "1", "1e20", "-1e20", "2.5", "3000000000", "-3000000000", "2147483647",
		"2147483648", "-2147483648", "-2147483649", "1e1", "10.0", "1E2", "2.5e3", "1e-2", "9223372036854775807",
		"9223372036854775808", "-9223372036854775809", "18446744073709551616", "1e400", "-1e400", "4.9e-324", "100.000000000000001",
		"1e-400", "-1e-400", "0e999", "-0.0", "1e1000", "1.00000000000000000000001"}
)

// edgeValue returns a boundary, badly formatted or wrongly typed value for
// slot s (sometimes a valid one).
func (g *gen) edgeValue(s slot, depth int) any {
	if g.chance(15) {
		return g.wrongType()
	}
	if g.chance(10) {
		return g.validValue(s, depth)
	}
	switch s.fd.Kind() {
	case protoreflect.StringKind:
		return g.edgeString(s.r.GetString())
	case protoreflect.EnumKind:
		values := s.fd.Enum().Values()
		switch g.pick(4) {
		case 0:
			return string(values.Get(g.pick(values.Len())).Name())
		case 1:
			return strings.ToLower(string(values.Get(g.pick(values.Len())).Name()))
		case 2:
			return string(values.Get(0).Name())
		}
		return clone(badEnums[g.pick(len(badEnums))])
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if s.fd.Message().FullName() == "google.protobuf.Timestamp" {
			if g.chance(15) {
				return num("1700000000")
			}
			return badTimestamps[g.pick(len(badTimestamps))]
		}
		if g.chance(50) {
			return map[string]any{}
		}
		return g.validMessage(s.fd.Message(), depth+1)
	case protoreflect.BoolKind:
		return []any{"true", num("0"), false}[g.pick(3)]
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		lo, hi := floatBounds(s)
		switch g.pick(4) {
		case 0:
			return []any{"NaN", "Infinity", "-Infinity", "nan", "5", "1e2"}[g.pick(6)]
		case 1:
			f := []float64{lo, hi, lo - 1, hi + 1, lo - 0.5, hi + 0.5, hi - 0.5, lo + 0.5}[g.pick(8)]
			return num(strconv.FormatFloat(f, 'g', -1, 64))
		case 2:
			// Just outside or inside a bound by less than half an ulp: the
			// literal breaks the rule, the double it rounds to does not.
			return num(nudge([]float64{lo, hi}[g.pick(2)], []int{-1, 1}[g.pick(2)]))
		}
		return num(badNumbers[g.pick(len(badNumbers))])
	}
	// Integers.
	lo, hi := intBounds(s)
	edges := []int64{lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, 0, -1}
	e := strconv.FormatInt(edges[g.pick(len(edges))], 10)
	switch g.pick(5) {
	case 0, 1:
		return num(e)
	case 2:
		if is64(s.fd.Kind()) {
			return badInt64Str[g.pick(len(badInt64Str))]
		}
		return e // a 32-bit integer as a string
	case 3:
		if is64(s.fd.Kind()) {
			return e
		}
	}
	return num(badNumbers[g.pick(len(badNumbers))])
}

// nudge returns the exact decimal v ± a tiny amount: 1e-400 around zero,
// 1e-25 elsewhere.
func nudge(v float64, sign int) string {
	if v == 0 {
		return map[int]string{-1: "-1e-400", 1: "1e-400"}[sign]
	}
	eps, _ := new(big.Rat).SetString("1e-25")
	r := new(big.Rat).SetFloat64(v)
	if sign < 0 {
		eps.Neg(eps)
	}
	return strings.TrimRight(r.Add(r, eps).FloatString(40), "0")
}

func (g *gen) edgeString(sr *validate.StringRules) string {
	switch g.pick(6) {
	case 0:
		if sr.GetEmail() {
			return badEmails[g.pick(len(badEmails))]
		}
		return badStrings[g.pick(len(badStrings))]
	case 1:
		// Lengths at and around the bounds, in 1-byte and 2-byte runes.
		var ns []int
		if sr.HasMinLen() {
			ns = append(ns, int(sr.GetMinLen())-1, int(sr.GetMinLen()))
		}
		if sr.HasMaxLen() {
			ns = append(ns, int(sr.GetMaxLen()), int(sr.GetMaxLen())+1)
		}
		ns = append(ns, 0, 600)
		n := max(ns[g.pick(len(ns))], 0)
		return strings.Repeat([]string{"a", "é", "😀"}[g.pick(3)], n)
	case 2:
		// A valid value, slightly damaged.
		v := []rune(g.validString(sr))
		switch {
		case len(v) == 0:
			return "x"
		case g.chance(25):
			return strings.ToLower(string(v))
		case g.chance(33):
			i := g.pick(len(v))
			return string(v[:i]) + string(v[i+1:])
		case g.chance(50):
			return string(v) + []string{"x", "0", " ", "\n", "-", "é"}[g.pick(6)]
		}
		return strings.ToUpper(string(v))
	case 3:
		return g.validString(sr)
	}
	return badStrings[g.pick(len(badStrings))]
}

// ---------------------------------------------------------------------------
// Mutations

// node is an object of the instance that holds a message.
type node struct {
	obj map[string]any
	md  protoreflect.MessageDescriptor
	ptr string
}

func isUserMessage(fd protoreflect.FieldDescriptor) bool {
	return fd.Message() != nil && !strings.HasPrefix(string(fd.Message().FullName()), "google.protobuf.")
}

// nodes lists the message objects of inst, walking md.
func nodes(obj map[string]any, md protoreflect.MessageDescriptor, ptr string, out []node) []node {
	out = append(out, node{obj, md, ptr})
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		v, ok := obj[string(fd.Name())]
		if !ok || fd.IsMap() || !isUserMessage(fd) {
			continue
		}
		p := ptr + "/" + string(fd.Name())
		if fd.IsList() {
			l, _ := v.([]any)
			for j, el := range l {
				if m, ok := el.(map[string]any); ok {
					out = nodes(m, fd.Message(), p+"/"+strconv.Itoa(j), out)
				}
			}
		} else if m, ok := v.(map[string]any); ok {
			out = nodes(m, fd.Message(), p, out)
		}
	}
	return out
}

// mutate changes inst once and says how.
func (g *gen) mutate(inst any, md protoreflect.MessageDescriptor) (any, string) {
	root, ok := inst.(map[string]any)
	if !ok {
		return inst, "(root not an object)"
	}
	if g.chance(3) {
		v := []any{[]any{}, []any{root}, "x", num("1"), nil, true}[g.pick(6)]
		return v, "root := non-object"
	}
	ns := nodes(root, md, "", nil)
	n := ns[g.pick(len(ns))]
	if g.chance(15) {
		return root, g.mutateNode(n)
	}
	fd := n.md.Fields().Get(g.pick(n.md.Fields().Len()))
	return root, g.mutateField(n, fd)
}

func (g *gen) mutateNode(n node) string {
	switch g.pick(5) {
	case 0:
		n.obj["bogus"] = g.validValue(slot{n.md.Fields().Get(0), &validate.FieldRules{}}, 2)
		return n.ptr + "/bogus := unknown field"
	case 1:
		// The camelCase JSON name instead of (or beside) the proto name.
		var aliased []protoreflect.FieldDescriptor
		fields := n.md.Fields()
		for i := range fields.Len() {
			if fd := fields.Get(i); fd.JSONName() != string(fd.Name()) {
				aliased = append(aliased, fd)
			}
		}
		if len(aliased) == 0 {
			n.obj["bogus"] = "x"
			return n.ptr + "/bogus := unknown field"
		}
		fd := aliased[g.pick(len(aliased))]
		v, ok := n.obj[string(fd.Name())]
		if !ok {
			v = g.validField(fd, 2)
		}
		if g.chance(70) {
			delete(n.obj, string(fd.Name()))
		}
		n.obj[fd.JSONName()] = v
		return n.ptr + "/" + fd.JSONName() + " := alias of " + string(fd.Name())
	case 2, 3:
		oneofs := n.md.Oneofs()
		for i := range oneofs.Len() {
			od := oneofs.Get(i)
			if od.IsSynthetic() {
				continue
			}
			members := od.Fields()
			if g.chance(50) {
				for j := range members.Len() {
					fd := members.Get(j)
					n.obj[string(fd.Name())] = g.validField(fd, 2)
				}
				return n.ptr + " := every member of oneof " + string(od.Name())
			}
			for j := range members.Len() {
				delete(n.obj, string(members.Get(j).Name()))
			}
			return n.ptr + " := no member of oneof " + string(od.Name())
		}
	}
	keys := sortedKeys(n.obj)
	if len(keys) == 0 {
		return n.ptr + " (empty, nothing removed)"
	}
	k := keys[g.pick(len(keys))]
	delete(n.obj, k)
	return "remove " + n.ptr + "/" + k
}

func (g *gen) mutateField(n node, fd protoreflect.FieldDescriptor) string {
	name := string(fd.Name())
	p := n.ptr + "/" + name
	cur, present := n.obj[name]
	set := func(v any, what string) string {
		n.obj[name] = v
		b, _ := json.Marshal(v)
		if len(b) > 60 {
			b = append(b[:57], "..."...)
		}
		return fmt.Sprintf("%s := %s (%s)", p, b, what)
	}
	if present && g.chance(20) {
		delete(n.obj, name)
		return "remove " + p
	}
	if g.chance(10) {
		return set(g.wrongType(), "wrong type")
	}
	if g.chance(15) {
		return set(g.validField(fd, 2), "valid")
	}
	r := g.fieldRules(fd)
	switch {
	case fd.IsList():
		rr := r.GetRepeated()
		l, _ := cur.([]any)
		switch g.pick(8) {
		case 0:
			return set([]any{}, "empty list")
		case 1:
			if len(l) == 0 {
				return set(g.list(fd, 1, false, 2), "one item")
			}
			i := g.pick(len(l))
			return set(append(l, clone(l[i])), fmt.Sprintf("duplicate item %d", i))
		case 2:
			k := 51
			if rr.HasMaxItems() {
				k = int(rr.GetMaxItems()) + 1
			}
			return set(g.list(fd, k, rr.GetUnique(), 2), fmt.Sprintf("%d items", k))
		case 3:
			k := 50
			if rr.HasMaxItems() {
				k = int(rr.GetMaxItems())
			}
			return set(g.list(fd, k, rr.GetUnique(), 2), fmt.Sprintf("%d items", k))
		case 4:
			if len(l) > 0 {
				i := g.pick(len(l))
				if g.chance(10) {
					l[i] = nil
				} else {
					l[i] = g.edgeValue(g.itemSlot(fd), 2)
				}
				return set(l, fmt.Sprintf("edge item %d", i))
			}
			return set([]any{g.edgeValue(g.itemSlot(fd), 2)}, "edge item 0")
		case 5:
			return set(append(l, g.edgeValue(g.itemSlot(fd), 2)), "append edge item")
		case 6:
			return set(append(l, g.validValue(g.itemSlot(fd), 2)), "append valid item")
		}
		return set(g.edgeValue(g.itemSlot(fd), 2), "bare item instead of a list")
	case fd.IsMap():
		m, _ := cur.(map[string]any)
		if m == nil {
			m = map[string]any{}
		}
		mr := r.GetMap()
		vs := g.itemSlot(fd)
		switch g.pick(7) {
		case 0:
			m[badMapKeys[g.pick(len(badMapKeys))]] = g.validValue(vs, 2)
			return set(m, "bad key")
		case 1, 2:
			k := 11
			if mr.HasMaxPairs() {
				k = int(mr.GetMaxPairs())
			}
			if g.chance(50) {
				k++
			}
			m = map[string]any{}
			for tries := 0; len(m) < k && tries < 100; tries++ {
				m[g.validKey(fd)] = g.validValue(vs, 2)
			}
			return set(m, fmt.Sprintf("%d pairs", len(m)))
		case 3:
			m[g.validKey(fd)] = g.edgeValue(vs, 2)
			return set(m, "edge value")
		case 4:
			m[g.validKey(fd)] = nil
			return set(m, "null value")
		case 5:
			m[g.validKey(fd)] = g.validValue(vs, 2)
			return set(m, "valid pair")
		}
		return set([]any{m}, "array instead of a map")
	}
	return set(g.edgeValue(slot{fd, r}, 2), "edge")
}
