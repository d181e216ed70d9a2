package confirm_test

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/mandate-dev/mandate/internal/facts"
	"github.com/mandate-dev/mandate/internal/manifest"
	"github.com/mandate-dev/mandate/services/confirm"
)

// TestPromptFactsCompiledOnce: what the prompt reads of a declaration
// (kinds, enum values, sensitive fields) is compiled when the manifest
// loads, each message once however many commands use it, and rendering
// prompts compiles nothing more. It is not parallel: it counts the
// process's compilations.
func TestPromptFactsCompiledOnce(t *testing.T) {
	before := facts.Compiled()
	set, err := manifest.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	loaded := facts.Compiled()
	messages := map[protoreflect.FullName]bool{}
	var reach func(md protoreflect.MessageDescriptor)
	reach = func(md protoreflect.MessageDescriptor) {
		if messages[md.FullName()] {
			return
		}
		messages[md.FullName()] = true
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if fd.IsMap() {
				fd = fd.MapValue()
			}
			if m := fd.Message(); m != nil && m.FullName().Parent() != "google.protobuf" {
				reach(m)
			}
		}
	}
	for _, c := range set.Commands() {
		md, _ := set.Method(c.Code)
		reach(md.Input())
		reach(md.Output())
	}
	if got := loaded - before; got != int64(len(messages)) {
		t.Fatalf("loading the manifest compiled %d messages; its commands reach %d", got, len(messages))
	}
	declared := 0
	for _, c := range set.Commands() {
		if c.Facts() == nil {
			t.Fatalf("%s: no facts", c.Code)
		}
		args := "{}"
		if len(c.Examples) > 0 {
			args = string(c.Examples[0].Input)
		}
		for range 50 {
			p, err := confirm.RenderPrompt(c, confirm.PromptInput{ArgumentsJSON: args, RequesterUser: "alice"})
			if err != nil {
				t.Fatalf("%s: %v", c.Code, err)
			}
			for _, f := range p.Fields {
				if f.Kind != confirm.KindText && f.Problem == "" {
					declared++
				}
			}
			confirm.PromptFields(c, args, nil)
		}
	}
	if declared == 0 {
		t.Fatal("no example's field was read by its declaration")
	}
	if after := facts.Compiled(); after != loaded {
		t.Fatalf("rendering %d commands' prompts compiled %d messages: facts are compiled per call", len(set.Commands()), after-loaded)
	}
}
