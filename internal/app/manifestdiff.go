package app

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/manifestdiff"
)

// Exit codes of `mandate manifest diff` (docs/governance-diff.md).
const (
	diffExitClean    = 0 // nothing at or above --fail-on
	diffExitFindings = 1 // findings at or above --fail-on
	diffExitInput    = 2 // usage or input error
)

// runManifest is `mandate manifest diff OLD NEW`.
func runManifest(ctx context.Context, args []string, io IO) error {
	if len(args) == 0 || args[0] != "diff" {
		fmt.Fprintln(io.Stderr, joinLines(
			"Usage: mandate manifest diff [--json] [--fail-on high|warn|info|none] [--overrides FILE] OLD NEW",
			"",
			"Compares two manifests for what they promise: every governance-significant change",
			"(risk lowered, confirmation dropped or loosened, approver weakened, permission,",
			"sensitive flag, separation of duties or condition removed, side effects,",
			"reversibility or idempotency changed, input schema widened, …) with a rule id and a",
			"severity (high, warn, info). OLD and NEW are manifest files or git objects",
			"REF:PATH (read with `git show`, e.g. v0.2.0:gen/manifest/manifest.json).",
			"",
			"Exit codes: 0 nothing at or above --fail-on, 1 findings at or above it, 2 usage or",
			"input error. The rules, the overrides file and the CI use: docs/governance-diff.md.",
		))
		return &clicore.ExitError{Code: diffExitInput, Err: clicore.ErrUsage}
	}
	var (
		asJSON    bool
		failOn    string
		overrides string
	)
	s := config.New("manifest diff", io.Env)
	s.FlagSet().SetOutput(io.Stderr)
	s.FlagSet().Usage = func() {
		fmt.Fprintln(io.Stderr, "Usage: mandate manifest diff [flags] OLD NEW   (OLD, NEW: a manifest file or a git object REF:PATH; exit 0 clean, 1 findings at or above --fail-on, 2 usage or input error)")
		s.FlagSet().PrintDefaults()
	}
	s.Bool(&asJSON, "json", false, "print one JSON report instead of one line per finding")
	s.String(&failOn, "fail-on", "high", "exit 1 when a finding is at or above this severity: high, warn, info, or none (never)")
	s.String(&overrides, "overrides", "", "YAML file of severity overrides: rule id (and optionally command) → high, warn, info or ignore, each with a reason")
	var threshold manifestdiff.Severity
	s.Check(func() error {
		if failOn == "none" {
			return nil
		}
		var err error
		if threshold, err = manifestdiff.ParseSeverity(failOn); err != nil {
			return s.Errorf("fail-on", "%v", err)
		}
		return nil
	})
	rest, err := parseInterspersed(s, args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &clicore.ExitError{Code: diffExitInput, Err: err}
	}
	if len(rest) != 2 {
		return &clicore.ExitError{Code: diffExitInput, Err: fmt.Errorf("want two manifests, OLD and NEW (got %d arguments)", len(rest))}
	}
	inputErr := func(err error) error { return &clicore.ExitError{Code: diffExitInput, Err: err} }
	var ov *manifestdiff.Overrides
	if overrides != "" {
		src, err := os.ReadFile(overrides) //nolint:gosec // the operator names the file
		if err != nil {
			return inputErr(err)
		}
		if ov, err = manifestdiff.ParseOverrides(overrides, src); err != nil {
			return inputErr(err)
		}
	}
	var ms [2]*manifestdiff.Manifest
	for i, arg := range rest {
		data, err := readManifestArg(ctx, arg)
		if err != nil {
			return inputErr(err)
		}
		if ms[i], err = manifestdiff.Parse(arg, data); err != nil {
			return inputErr(err)
		}
	}
	findings, unused := ov.Apply(manifestdiff.Diff(ms[0], ms[1]))
	failing := manifestdiff.Failing(findings, threshold)
	counts := manifestdiff.Count(findings)
	if asJSON {
		err = manifestdiff.WriteJSON(io.Stdout, manifestdiff.Report{
			Old: rest[0], New: rest[1], FailOn: failOn, Failed: failing > 0, Counts: counts, Findings: findings, UnusedOverrides: unused,
		})
	} else {
		err = manifestdiff.WriteText(io.Stdout, findings)
	}
	if err != nil {
		return err
	}
	for _, u := range unused {
		fmt.Fprintf(io.Stderr, "%s:%d: the override of %s%s matched no finding; remove it\n", overrides, u.Line, u.Rule, forCommandSuffix(u.Command))
	}
	fmt.Fprintf(io.Stderr, "manifest diff %s → %s: %d high, %d warn, %d info", rest[0], rest[1], counts.High, counts.Warn, counts.Info)
	if failing > 0 {
		fmt.Fprintf(io.Stderr, "; %d at or above %s: failed\n", failing, failOn)
		return &clicore.ExitError{Code: diffExitFindings}
	}
	fmt.Fprintf(io.Stderr, "; none at or above %s\n", failOn)
	return nil
}

func forCommandSuffix(c string) string {
	if c == "" {
		return ""
	}
	return " for " + c
}

// parseInterspersed parses flags that may come before, between or after
// the positional arguments, and returns the positional ones.
func parseInterspersed(s *config.Set, args []string) ([]string, error) {
	var pos, flags []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			pos = append(pos, args[i+1:]...)
			i = len(args)
		case strings.HasPrefix(a, "-") && a != "-":
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if f := s.FlagSet().Lookup(name); f != nil && !strings.Contains(name, "=") && !isBoolFlag(f.Value) && i+1 < len(args) {
				i++
				flags = append(flags, args[i])
			}
		default:
			pos = append(pos, a)
		}
	}
	if err := s.Parse(flags); err != nil {
		return nil, err
	}
	return append(pos, s.FlagSet().Args()...), nil
}

func isBoolFlag(v interface{ String() string }) bool {
	b, ok := v.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// readManifestArg reads a manifest file, or a git object REF:PATH through
// `git show` in the working directory's repository when no such file
// exists.
func readManifestArg(ctx context.Context, arg string) ([]byte, error) {
	if _, err := os.Stat(arg); err == nil {
		return os.ReadFile(arg) //nolint:gosec // the operator names the file
	}
	ref, path, ok := strings.Cut(arg, ":")
	if !ok || ref == "" || path == "" || strings.HasPrefix(arg, "-") {
		return nil, fmt.Errorf("%s: no such file (a git object is REF:PATH)", arg)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "git", "show", arg) //nolint:gosec // G204: the operator names the object; it cannot start with "-"
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: not a file, and git show failed: %s", arg, strings.TrimSpace(firstLine(stderr.String(), err)))
	}
	return stdout.Bytes(), nil
}

func firstLine(s string, err error) string {
	if s == "" {
		return err.Error()
	}
	line, _, _ := strings.Cut(s, "\n")
	return line
}
