package executor

import (
	"slices"
	"testing"
	"time"

	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/internal/schema"
)

// TestFactsCompiledOnce: what compileFacts compiles when the executor
// starts is what a call would otherwise derive from the declaration each
// time — the dispatch deadline (declared, or the default) and the result's
// sensitive paths — for every command of the sample.
func TestFactsCompiledOnce(t *testing.T) {
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	const def = 7 * time.Second
	facts := compileFacts(set, def)
	declared, sensitive := 0, 0
	for _, c := range set.Commands() {
		f, ok := facts[c.Code]
		if !ok {
			t.Fatalf("%s: no facts", c.Code)
		}
		want := def
		if c.Deadline != "" {
			d, err := time.ParseDuration(c.Deadline)
			if err != nil {
				t.Fatalf("%s: deadline %q: %v", c.Code, c.Deadline, err)
			}
			want = d
			declared++
		}
		if f.deadline != want {
			t.Fatalf("%s: deadline %s, want %s", c.Code, f.deadline, want)
		}
		md, _ := set.Method(c.Code)
		if got, want := f.outputSensitive, schema.SensitivePaths(md.Output()); !slices.Equal(got, want) {
			t.Fatalf("%s: result's sensitive paths %v, want %v", c.Code, got, want)
		}
		if len(f.outputSensitive) > 0 {
			sensitive++
		}
	}
	if declared == 0 || declared == len(set.Commands()) {
		t.Fatalf("%d of %d commands declare a deadline: the sample should exercise both cases", declared, len(set.Commands()))
	}
	if e := (&Executor{facts: facts, cfg: Config{DefaultDeadline: def}}); e.deadline(&manifest.Command{Code: "not.compiled", Deadline: "3s"}) != 3*time.Second {
		t.Fatal("a command the facts do not know: its declared deadline is not used")
	}
	t.Logf("%d commands, %d with a declared deadline, %d with sensitive result fields", len(set.Commands()), declared, sensitive)
}
