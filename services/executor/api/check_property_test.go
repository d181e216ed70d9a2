package api_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// TestCheckAgreesWithRandomCalls is the property of issue 29 §3: for
// random calls — any of the policy's principals (and unknown ones), any
// command (and unknown ones), arguments that are each command's declared
// examples, mangled or empty, with or without an idempotency key (fresh or
// used before), with or without a grant that names nothing — Check's
// verdict is what the call then meets: allowed where the call succeeds,
// approval required where it is refused confirmation.required, and
// otherwise refused at the same stage with the same code. The seed is
// logged; a failure names the call.
func TestCheckAgreesWithRandomCalls(t *testing.T) { eachStore(t, testCheckAgreesWithRandomCalls) }

func testCheckAgreesWithRandomCalls(t *testing.T, st stores) {
	e := start(t, st)
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0x29))
	who := [][3]string{
		{"acme", "alice", ""}, {"acme", "bob", ""}, {"acme", "carol", ""}, {"acme", "lena", ""},
		{"acme", "alice", "support-bot"}, {"acme", "carol", "finance-bot"}, {"acme", "carol", "rogue-bot"},
		{"acme", "mallory", ""}, {"globex", "dave", ""},
	}
	codes := []string{"ticket.nope"}
	examples := map[string][]string{}
	for _, c := range set.Commands() {
		codes = append(codes, c.Code)
		for _, ex := range c.Examples {
			examples[c.Code] = append(examples[c.Code], string(ex.Input))
		}
	}
	mangle := func(in string) string {
		var m map[string]any
		if json.Unmarshal([]byte(in), &m) != nil || len(m) == 0 {
			return `{"bogus":true}`
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		k := keys[rng.IntN(len(keys))]
		switch rng.IntN(3) {
		case 0:
			delete(m, k)
		case 1:
			m[k] = 12345
		default:
			m["unknown_field"] = "x"
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	var usedKeys []string
	const n = 120
	agreed := map[string]int{}
	for i := range n {
		p := who[rng.IntN(len(who))]
		code := codes[rng.IntN(len(codes))]
		input := "{}"
		if ex := examples[code]; len(ex) > 0 {
			input = ex[rng.IntN(len(ex))]
			if rng.IntN(3) == 0 {
				input = mangle(input)
			}
		}
		var opts []func(*mandatev1.ExecuteRequest)
		switch r := rng.IntN(4); {
		case r == 0 && len(usedKeys) > 0:
			opts = append(opts, withKey(usedKeys[rng.IntN(len(usedKeys))]))
		case r <= 1:
			k := fmt.Sprintf("prop-%d", i)
			usedKeys = append(usedKeys, k)
			opts = append(opts, withKey(k))
		}
		if rng.IntN(8) == 0 {
			opts = append(opts, func(r *mandatev1.ExecuteRequest) { r.ApprovalGrantId = "ch-that-names-nothing" })
		}
		ctx := as(token(t, p[0], p[1], p[2]))
		call := fmt.Sprintf("call %d: %s as %s/%s/%s with %s", i, code, p[0], p[1], p[2], input)
		v := e.check(t, ctx, code, input, opts...)
		_, err := e.execute(t, ctx, code, input, opts...)
		ce := refusal(err)
		switch v.GetVerdict() {
		case mandatev1.Verdict_VERDICT_ALLOWED:
			if err != nil {
				t.Fatalf("%s: checked allowed, the call: %v (%s/%s)", call, err, ce.GetStage(), ce.GetCode())
			}
		case mandatev1.Verdict_VERDICT_APPROVAL_REQUIRED:
			if ce.GetCode() != v.GetReason().GetCode() || ce.GetStage() != "confirmation_check" {
				t.Fatalf("%s: checked %s, the call: %v (%s/%s)", call, v.GetReason().GetCode(), err, ce.GetStage(), ce.GetCode())
			}
		default:
			if ce.GetStage() != v.GetReason().GetStage() || ce.GetCode() != v.GetReason().GetCode() {
				t.Fatalf("%s: checked refused %s/%s, the call: %v (%s/%s)", call, v.GetReason().GetStage(), v.GetReason().GetCode(), err, ce.GetStage(), ce.GetCode())
			}
		}
		verdict := strings.TrimPrefix(v.GetVerdict().String(), "VERDICT_")
		if r := v.GetReason(); r != nil {
			verdict += " " + r.GetStage() + "/" + r.GetCode()
		}
		agreed[verdict]++
	}
	t.Logf("%d random calls, check and call agreed on each: %v", n, agreed)
}
