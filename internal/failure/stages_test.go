package failure_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
	"github.com/mandate-dev/mandate/internal/failure"
)

// TestStagesAreTheEnum: the stage constants are exactly the wire names of
// mandate.v1.Stage, and every stage the code table names is one of them.
func TestStagesAreTheEnum(t *testing.T) {
	consts := []string{
		failure.StageDecode, failure.StageAuthenticate, failure.StageRequest, failure.StageLoad,
		failure.StageEntitlement, failure.StagePermission, failure.StageSchema, failure.StageScope,
		failure.StageIdempotency, failure.StageSoD, failure.StageConfirmation, failure.StageAudit,
		failure.StageDispatch, failure.StageState, failure.StagePreInvariant, failure.StageAssert,
		failure.StagePostInvariant, failure.StageAuditOutcome, failure.StagePublish, failure.StageCondition,
		failure.StageBudget,
	}
	if got := failure.Stages(); !slices.Equal(got, consts) {
		t.Fatalf("the enum's stages %v\n          constants %v", got, consts)
	}
	for _, n := range consts {
		s, ok := failure.StageOf(n)
		if !ok || failure.StageName(s) != n {
			t.Errorf("%s does not round-trip through mandate.v1.Stage (%v %v)", n, s, ok)
		}
	}
	if _, ok := failure.StageOf("nonsense"); ok {
		t.Error("StageOf accepts a name that is no stage")
	}
	if failure.StageName(mandatev1.Stage_STAGE_UNSPECIFIED) != "" || failure.StageName(mandatev1.Stage(999)) != "" {
		t.Error("StageName names the unspecified or an unknown value")
	}
	for _, s := range failure.Codes() {
		for _, st := range s.Stages {
			if _, ok := failure.StageOf(st); !ok {
				t.Errorf("code %s names stage %q, which mandate.v1.Stage does not list", s.Code, st)
			}
		}
	}
}

// commonWordStages are stages whose names are also ordinary words of the
// code base (the audit service, a dispatcher, an assertion): a literal
// "audit" is rarely the stage, so the literal check skips them.
var commonWordStages = map[string]bool{
	failure.StageDecode: true, failure.StageAudit: true, failure.StageDispatch: true,
	failure.StageAssert: true, failure.StagePublish: true,
}

// TestStageNamesComeFromTheEnum fails on a string literal that spells a
// stage in a non-test Go file outside this package: stages are spelled
// failure.StageX, so the enum stays the one list of them.
func TestStageNamesComeFromTheEnum(t *testing.T) {
	names := map[string]bool{}
	for _, n := range failure.Stages() {
		if !commonWordStages[n] {
			names[n] = true
		}
	}
	root := filepath.Join("..", "..")
	var bad []string
	for _, dir := range []string{"cmd", "examples", "internal", "pkg", "services"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			rel = filepath.ToSlash(rel)
			if d.IsDir() {
				if rel == "internal/failure" || strings.HasSuffix(rel, "/gen") {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
				return nil
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				if v, err := strconv.Unquote(lit.Value); err == nil && names[v] {
					bad = append(bad, rel+":"+strconv.Itoa(fset.Position(lit.Pos()).Line)+": "+strconv.Quote(v)+": use failure.Stage…")
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range bad {
		t.Error(b)
	}
}
