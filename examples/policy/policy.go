// Package policy embeds the demo policy directory (demo.yaml) that
// `mandate dev` starts with and that `mandate policy apply` seeds in the
// compose stack.
package policy

import _ "embed"

// Demo is examples/policy/demo.yaml.
//
//go:embed demo.yaml
var Demo []byte
