package failure_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/mandate-dev/mandate/internal/failure"
)

// notCodes are strings in a code's namespace that are not codes.
var notCodes = map[string]string{
	// Violation rules (failure.Violation.Rule) of the strict decoder.
	"schema.decode": "violation rule", "schema.duplicate_key": "violation rule", "schema.enum": "violation rule",
	"schema.format": "violation rule", "schema.null": "violation rule", "schema.oneof": "violation rule",
	"schema.range": "violation rule", "schema.syntax": "violation rule", "schema.too_deep": "violation rule",
	"schema.too_large": "violation rule", "schema.type": "violation rule", "schema.unknown_field": "violation rule",
	"schema.utf8": "violation rule",
	// Permissions.
	"audit.read": "permission", "audit.resolve": "permission", "directory.manage": "permission",
	// File names the build plugin writes.
	"manifest.json": "file name", "manifest.go": "file name",
	// OpenTelemetry resource attributes.
	"service.name": "attribute", "service.version": "attribute",
}

var literalShape = regexp.MustCompile(`^[a-z]+\.[a-z_0-9]+$`)

// TestCodesComeFromTheTable fails on a string literal in a code's namespace
// in a non-test Go file outside this package: a code of the table is
// spelled failure.CodeX, and a new code is added to the table first.
func TestCodesComeFromTheTable(t *testing.T) {
	namespaces := map[string]bool{}
	for _, s := range failure.Codes() {
		namespaces[namespace(s.Code)] = true
	}
	root := filepath.Join("..", "..")
	var bad []string
	for _, dir := range []string{"cmd", "examples", "internal", "pkg", "services", "tests"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			rel = filepath.ToSlash(rel)
			if d.IsDir() {
				// internal/manifestdiff's rule ids (`condition.removed`,
				// `schema.bound_relaxed`, …) name changes to a manifest,
				// not refusals: they are no codes of the table.
				if rel == "internal/failure" || rel == "internal/manifestdiff" {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
				return nil
			}
			for _, lit := range codeLiterals(t, path, namespaces) {
				if notCodes[lit.value] != "" {
					continue
				}
				what := "use its failure.Code constant"
				if _, ok := failure.Lookup(lit.value); !ok {
					what = "not in the table: add it to internal/failure, or to notCodes if it is no code"
				}
				bad = append(bad, rel+":"+strconv.Itoa(lit.line)+": "+strconv.Quote(lit.value)+": "+what)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b)
	}
}

type literal struct {
	value string
	line  int
}

// codeLiterals returns the string literals of a Go file that look like a
// code of one of namespaces.
func codeLiterals(t *testing.T, path string, namespaces map[string]bool) []literal {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var out []literal
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		v, err := strconv.Unquote(lit.Value)
		if err != nil || !literalShape.MatchString(v) || !namespaces[namespace(v)] {
			return true
		}
		out = append(out, literal{value: v, line: fset.Position(lit.Pos()).Line})
		return true
	})
	return out
}

// namespace is the part of a code before its first dot, e.g. "schema" of
// schema.invalid.
func namespace(code string) string {
	ns, _, _ := strings.Cut(code, ".")
	return ns
}
