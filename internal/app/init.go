package app

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
)

//go:embed scaffold/*.tmpl
var scaffold embed.FS

// scaffoldName is what a service name may be: it becomes the proto
// package, the Go package and the prefix of every command code.
var scaffoldName = regexp.MustCompile(`^[a-z][a-z0-9]{1,30}$`)

// scaffoldData fills the templates.
type scaffoldData struct{ Name, Service, Module string }

// runInit is `mandate init DIR --service NAME`: a module that builds and
// runs in `mandate dev` once its generated code is written (go mod tidy,
// buf generate): a proto with a read and a write command, buf config with
// the generators as Go tools, a backend on pkg/backend and pkg/receipt, a
// policy file, and Mandate's protos exported into third_party/mandate.
func runInit(_ context.Context, args []string, io IO) error {
	var name, module, replace string
	s := config.New("init", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	s.String(&name, "service", "", "the service's name: lower-case letters and digits, e.g. orders (proto package orders.v1, service OrdersService, commands orders.item.*)")
	s.Require("service", func() bool { return name == "" })
	s.String(&module, "module", "", "the Go module path (default example.com/<service>)")
	s.String(&replace, "replace", "", "a local checkout of github.com/mandate-dev/mandate to build against (a replace directive), instead of a released version")
	// DIR may come first (mandate init DIR --service NAME) or last.
	var dir string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		dir, args = args[0], args[1:]
	}
	if err := s.Parse(args); err != nil {
		return err
	}
	if rest := s.FlagSet().Args(); dir == "" && len(rest) == 1 {
		dir = rest[0]
	} else if len(rest) != 0 {
		dir = ""
	}
	if dir == "" {
		return fmt.Errorf("%w: name one directory to create: mandate init DIR --service NAME", clicore.ErrUsage)
	}
	if !scaffoldName.MatchString(name) {
		return fmt.Errorf("%w: --service %q must be 2 to 31 lower-case letters and digits, starting with a letter", clicore.ErrUsage, name)
	}
	if module == "" {
		module = "example.com/" + name
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s exists and is not empty: nothing was written", dir)
	}
	d := scaffoldData{Name: name, Service: strings.ToUpper(name[:1]) + name[1:] + "Service", Module: module}
	files := map[string]string{
		"proto.tmpl":        filepath.Join("proto", name, "v1", name+".proto"),
		"server.go.tmpl":    "server.go",
		"main.go.tmpl":      filepath.Join("cmd", name, "main.go"),
		"policy.tmpl":       "policy.yaml",
		"buf.yaml.tmpl":     "buf.yaml",
		"buf.gen.yaml.tmpl": "buf.gen.yaml",
		"README.md.tmpl":    "README.md",
	}
	out := map[string][]byte{"go.mod": goMod(d, replace)}
	for from, to := range files {
		t, err := template.ParseFS(scaffold, "scaffold/"+from)
		if err != nil {
			return err
		}
		var b bytes.Buffer
		if err := t.Execute(&b, d); err != nil {
			return err
		}
		out[to] = b.Bytes()
	}
	protos, err := exportedProtos()
	if err != nil {
		return err
	}
	for _, f := range protos {
		out[filepath.Join("third_party", "mandate", filepath.FromSlash(f.to))] = f.data
	}
	for to, data := range out {
		p := filepath.Join(dir, to)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil { //nolint:gosec // G301: source files the adopter commits
			return err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil { //nolint:gosec // G306: source files the adopter commits
			return err
		}
	}
	fmt.Fprintf(io.Stdout, "wrote the %s service to %s (module %s). Next, in %s:\n"+
		"  go mod tidy -e && buf generate && go build ./...   (-e: gen/ does not exist until buf generate)\n"+
		"then README.md says how to run it in mandate dev.\n", name, dir, module, dir)
	return nil
}

// goMod is the scaffold's go.mod: the generators as tools, and Mandate
// from a local checkout when replace names one (go mod tidy resolves the
// rest).
func goMod(d scaffoldData, replace string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "module %s\n\ngo 1.26.0\n\n", d.Module)
	if replace != "" {
		abs, err := filepath.Abs(replace)
		if err == nil {
			replace = abs
		}
		fmt.Fprintf(&b, "require github.com/mandate-dev/mandate v0.0.0\n\nreplace github.com/mandate-dev/mandate => %s\n\n", replace)
	}
	b.WriteString("tool (\n\tgithub.com/mandate-dev/mandate/cmd/protoc-gen-mandate\n\tgoogle.golang.org/grpc/cmd/protoc-gen-go-grpc\n\tgoogle.golang.org/protobuf/cmd/protoc-gen-go\n)\n")
	return []byte(b.String())
}
