package executor

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/mandate-dev/mandate/internal/facts"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/confirm"
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
	compiled := compileFacts(set, def)
	declared, sensitive := 0, 0
	for _, c := range set.Commands() {
		f, ok := compiled[c.Code]
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
		if got, want := f.outputSensitive, facts.SensitivePaths(md.Output()); !slices.Equal(got, want) {
			t.Fatalf("%s: result's sensitive paths %v, want %v", c.Code, got, want)
		}
		if len(f.outputSensitive) > 0 {
			sensitive++
		}
	}
	if declared == 0 || declared == len(set.Commands()) {
		t.Fatalf("%d of %d commands declare a deadline: the sample should exercise both cases", declared, len(set.Commands()))
	}
	if e := (&Executor{facts: compiled, cfg: Config{DefaultDeadline: def}}); e.deadline(&manifest.Command{Code: "not.compiled", Deadline: "3s"}) != 3*time.Second {
		t.Fatal("a command the facts do not know: its declared deadline is not used")
	}
	t.Logf("%d commands, %d with a declared deadline, %d with sensitive result fields", len(set.Commands()), declared, sensitive)
}

// sampleSets are the sample manifests: the embedded helpdesk sample and
// the inventory example's build.
func sampleSets(t *testing.T) map[string]*manifest.Set {
	t.Helper()
	helpdesk, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("..", "..", "examples", "inventory", "gen", "manifest")
	inventory, err := manifest.LoadFiles(filepath.Join(dir, "manifest.json"), filepath.Join(dir, "descriptors.binpb"))
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*manifest.Set{"helpdesk": helpdesk, "inventory": inventory}
}

// fullInput is a JSON input to md with every field set, lists of two
// elements and maps of two entries, down to depth messages deep.
func fullInput(md protoreflect.MessageDescriptor, depth int) map[string]any {
	out := map[string]any{}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsList():
			out[string(fd.Name())] = []any{valueOf(fd, depth), valueOf(fd, depth)}
		case fd.IsMap():
			out[string(fd.Name())] = map[string]any{"a": valueOf(fd.MapValue(), depth), "b/~": valueOf(fd.MapValue(), depth)}
		default:
			out[string(fd.Name())] = valueOf(fd, depth)
		}
	}
	return out
}

func valueOf(fd protoreflect.FieldDescriptor, depth int) any {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return true
	case protoreflect.StringKind, protoreflect.BytesKind:
		return "value of " + string(fd.Name())
	case protoreflect.EnumKind:
		return string(fd.Enum().Values().Get(fd.Enum().Values().Len() - 1).Name())
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if fd.Message().FullName() == "google.protobuf.Timestamp" {
			return "2026-03-01T15:04:05Z"
		}
		if depth > 6 {
			return map[string]any{}
		}
		return fullInput(fd.Message(), depth+1)
	}
	return "7"
}

// TestRedactionAgreesWithThePrompt: for every command of the sample
// manifests, the arguments the executor withholds (from the audit and
// from what it sends the confirm service) are exactly those the
// approver's prompt withholds, whether the prompt gets the arguments
// redacted or, by mistake, whole.
func TestRedactionAgreesWithThePrompt(t *testing.T) {
	sensitive := 0
	for name, set := range sampleSets(t) {
		e := &Executor{facts: compileFacts(set, time.Second)}
		for _, c := range set.Commands() {
			md, _ := set.Method(c.Code)
			input, err := json.Marshal(fullInput(md.Input(), 0))
			if err != nil {
				t.Fatal(err)
			}
			redacted, withheld := e.redactArguments(c, input)
			if len(withheld) > 0 {
				sensitive++
			}
			for _, in := range []confirm.PromptInput{
				{ArgumentsJSON: string(redacted), WithheldFields: withheld, RequesterUser: "alice"},
				{ArgumentsJSON: string(input), RequesterUser: "alice"},
			} {
				p, err := confirm.RenderPrompt(c, in)
				if err != nil {
					t.Fatalf("%s %s: %v", name, c.Code, err)
				}
				var shown []string
				for _, f := range p.Fields {
					if f.Kind == confirm.KindWithheld {
						shown = append(shown, f.Pointer)
					}
				}
				slices.Sort(shown)
				if !slices.Equal(p.WithheldFields, withheld) || !slices.Equal(shown, withheld) {
					t.Errorf("%s %s: the executor withholds %q; the prompt withholds %q and shows withheld %q", name, c.Code, withheld, p.WithheldFields, shown)
				}
				if p.ArgumentsJSON != string(redacted) {
					t.Errorf("%s %s: the prompt's arguments\n%s\nare not the executor's redaction\n%s", name, c.Code, p.ArgumentsJSON, redacted)
				}
			}
		}
	}
	if sensitive == 0 {
		t.Fatal("no command of the samples has a sensitive input field: the test checks nothing")
	}
}
