package app

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	mandate "github.com/mandate-dev/mandate"
	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
)

// runProto is `mandate proto export DIR`: it writes the .proto files an
// adopter's build imports — mandate/v1/*.proto and the vendored
// buf/validate and google/api protos — with the vendored trees' LICENSE and
// SOURCE files, laid out as import paths.
func runProto(_ context.Context, args []string, io IO) error {
	if len(args) == 0 || args[0] != "export" {
		fmt.Fprintln(io.Stderr, joinLines(
			"Usage: mandate proto export [--force] DIR",
			"",
			"Writes the .proto files a service governed by Mandate imports, laid out by import",
			"path: mandate/v1/*.proto (options.proto declares commands; errors.proto is the",
			"refusal detail; receipt.proto the receipt service; preview.proto the preflight a",
			"backend may offer), buf/validate/validate.proto and",
			"google/api/{annotations,http,field_behavior}.proto, each third-party tree with its",
			"LICENSE and SOURCE under licenses/. List DIR as a module in your buf.yaml",
			"(docs/adopting.md). An existing file is not overwritten without --force.",
		))
		return clicore.ErrUsage
	}
	var force bool
	s := config.New("proto export", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	s.Bool(&force, "force", false, "overwrite files that already exist in DIR")
	if err := s.Parse(args[1:]); err != nil {
		return err
	}
	rest := s.FlagSet().Args()
	if len(rest) != 1 || rest[0] == "" {
		return fmt.Errorf("%w: name one directory to write into", clicore.ErrUsage)
	}
	files, err := exportedProtos()
	if err != nil {
		return err
	}
	dir := rest[0]
	if !force {
		for _, f := range files {
			if _, err := os.Stat(filepath.Join(dir, f.to)); err == nil {
				return fmt.Errorf("%s exists: nothing was written (use --force to overwrite)", filepath.Join(dir, f.to))
			}
		}
	}
	for _, f := range files {
		to := filepath.Join(dir, filepath.FromSlash(f.to))
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil { //nolint:gosec // G301: source files the adopter commits
			return err
		}
		if err := os.WriteFile(to, f.data, 0o644); err != nil { //nolint:gosec // G306: source files the adopter commits
			return err
		}
	}
	fmt.Fprintf(io.Stdout, "wrote %d files to %s\n", len(files), dir)
	return nil
}

type exportedFile struct {
	to   string // slash-separated path under the export directory
	data []byte
}

// exportedProtos maps the embedded tree to the export layout: the
// contract under its import path, each vendored tree's protos under theirs
// and its LICENSE and SOURCE under licenses/<tree>/.
func exportedProtos() ([]exportedFile, error) {
	var out []exportedFile
	err := fs.WalkDir(mandate.Protos, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(mandate.Protos, p)
		if err != nil {
			return err
		}
		var to string
		switch parts := strings.SplitN(p, "/", 3); {
		case parts[0] == "proto" && len(parts) == 3:
			to = parts[1] + "/" + parts[2] // proto/mandate/v1/x.proto → mandate/v1/x.proto
		case parts[0] == "third_party" && len(parts) == 3 && path.Ext(p) == ".proto":
			to = parts[2] // third_party/googleapis/google/api/http.proto → google/api/http.proto
		case parts[0] == "third_party" && len(parts) == 3:
			to = "licenses/" + parts[1] + "/" + parts[2] // LICENSE, SOURCE
		default:
			return fmt.Errorf("proto export: unexpected embedded file %s", p)
		}
		out = append(out, exportedFile{to: to, data: data})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("proto export: no protos are embedded in this binary")
	}
	return out, nil
}
