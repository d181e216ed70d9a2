// Package config binds command-line flags to MANDATE_* environment
// variables and validates them at start-up. A flag given on the command line
// wins over the environment; a setting that fails validation stops the
// process with an error naming the flag and its variable. Secrets are held
// in Secret values, which never print.
package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// Secret is a sensitive setting. It formats as "[redacted]" in every verb,
// so it cannot leak through logs, errors or %v dumps.
type Secret struct{ value string }

// NewSecret wraps a secret value.
func NewSecret(v string) Secret { return Secret{value: v} }

// Reveal returns the secret. Call it only where the value is used.
func (s Secret) Reveal() string { return s.value }

// Set reports whether the secret has a value.
func (s Secret) Set() bool { return s.value != "" }

// String implements fmt.Stringer.
func (s Secret) String() string {
	if s.value == "" {
		return ""
	}
	return "[redacted]"
}

// GoString implements fmt.GoStringer.
func (s Secret) GoString() string { return s.String() }

// Format implements fmt.Formatter for every verb.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(s.String())) }

// MarshalText keeps secrets out of encoded configuration dumps.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Set is a flag set whose flags fall back to MANDATE_* variables.
type Set struct {
	fs       *flag.FlagSet
	env      func(string) (string, bool)
	envNames map[string]string
	checks   []func() error
}

// New returns a Set for the named subcommand. lookupEnv is os.LookupEnv
// in production and a map in tests.
func New(name string, lookupEnv func(string) (string, bool)) *Set {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return &Set{fs: fs, env: lookupEnv, envNames: map[string]string{}}
}

// FlagSet returns the underlying flag set (for usage output).
func (s *Set) FlagSet() *flag.FlagSet { return s.fs }

// EnvName returns the variable a flag falls back to: --database-url →
// MANDATE_DATABASE_URL.
func EnvName(flagName string) string {
	return "MANDATE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func (s *Set) usage(name, help string) string {
	s.envNames[name] = EnvName(name)
	declared.Store(EnvName(name), true)
	return help + " (env " + EnvName(name) + ")"
}

// String declares a string setting.
func (s *Set) String(p *string, name, def, help string) {
	s.fs.StringVar(p, name, def, s.usage(name, help))
}

// Strings declares a comma-separated list setting.
func (s *Set) Strings(p *[]string, name string, def []string, help string) {
	*p = def
	s.fs.Func(name, s.usage(name, help)+" (comma-separated)", func(v string) error {
		*p = splitList(v)
		return nil
	})
}

// Bool declares a boolean setting.
func (s *Set) Bool(p *bool, name string, def bool, help string) {
	s.fs.BoolVar(p, name, def, s.usage(name, help))
}

// Int declares an integer setting.
func (s *Set) Int(p *int, name string, def int, help string) {
	s.fs.IntVar(p, name, def, s.usage(name, help))
}

// Duration declares a duration setting.
func (s *Set) Duration(p *time.Duration, name string, def time.Duration, help string) {
	s.fs.DurationVar(p, name, def, s.usage(name, help))
}

// SecretVar declares a secret setting. Its default is never shown.
func (s *Set) SecretVar(p *Secret, name, help string) {
	s.fs.Func(name, s.usage(name, help)+"; prefer the variable, flags show in process lists", func(v string) error {
		*p = NewSecret(v)
		return nil
	})
}

// Check adds a validation run by Parse after flags and variables are read.
func (s *Set) Check(fn func() error) { s.checks = append(s.checks, fn) }

// Require adds a check that the setting is not empty.
func (s *Set) Require(name string, empty func() bool) {
	s.Check(func() error {
		if empty() {
			return s.Errorf(name, "is required")
		}
		return nil
	})
}

// Errorf returns an error naming a setting and its variable.
func (s *Set) Errorf(name, format string, args ...any) error {
	return fmt.Errorf("--%s (%s) %s", name, EnvName(name), fmt.Sprintf(format, args...))
}

// Parse reads args, then fills every flag not given on the command line
// from its variable, then runs the checks. Every failing check is reported.
func (s *Set) Parse(args []string) error {
	if err := s.fs.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	s.fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	names := make([]string, 0, len(s.envNames))
	for n := range s.envNames {
		names = append(names, n)
	}
	sort.Strings(names)
	var errs []error
	for _, name := range names {
		if given[name] {
			continue
		}
		v, ok := s.env(s.envNames[name])
		if !ok {
			continue
		}
		if err := s.fs.Set(name, v); err != nil {
			// The value may be a secret: name the variable, not the value.
			errs = append(errs, fmt.Errorf("%s: invalid value for --%s", s.envNames[name], name))
		}
	}
	for _, c := range s.checks {
		if err := c(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
