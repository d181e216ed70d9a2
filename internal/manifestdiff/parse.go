package manifestdiff

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/mandate-dev/mandate/internal/manifest"
)

// Manifest is a manifest read for comparison: every command as the JSON
// object it is, by code.
type Manifest struct {
	// Name is what the manifest was read from, for messages.
	Name     string
	commands map[string]map[string]any
}

// ErrInput marks a manifest or overrides file that cannot be read.
var ErrInput = errors.New("manifestdiff: bad input")

// Parse reads manifest JSON (the canonical manifest a build writes,
// format mandate.manifest/v1). Numbers are kept as written.
func Parse(name string, data []byte) (*Manifest, error) {
	fail := func(format string, args ...any) (*Manifest, error) {
		return nil, fmt.Errorf("%w: %s: %s", ErrInput, name, fmt.Sprintf(format, args...))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var top map[string]any
	if err := dec.Decode(&top); err != nil {
		return fail("not a JSON object: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fail("more than one JSON value")
	}
	if f, _ := top["format"].(string); f != manifest.Format {
		return fail("format is %q, want %q", top["format"], manifest.Format)
	}
	list, ok := top["commands"].([]any)
	if !ok {
		return fail("no commands list")
	}
	m := &Manifest{Name: name, commands: map[string]map[string]any{}}
	for i, v := range list {
		c, ok := v.(map[string]any)
		if !ok {
			return fail("commands[%d] is not an object", i)
		}
		code, _ := c["code"].(string)
		if code == "" {
			return fail("commands[%d] has no code", i)
		}
		if _, dup := m.commands[code]; dup {
			return fail("command %s is listed twice", code)
		}
		m.commands[code] = c
	}
	return m, nil
}

// Codes returns the manifest's command codes.
func (m *Manifest) Codes() []string {
	out := make([]string, 0, len(m.commands))
	for c := range m.commands {
		out = append(out, c)
	}
	return out
}
