package helm_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The Kubernetes JSON schemas kubeconform validates against, made offline
// from the OpenAPI v2 document Kubernetes publishes in its own module
// (k8s.io/kubernetes, api/openapi-spec/swagger.json): one standalone
// schema per kind — every $ref inlined — and strict — every object with
// declared properties refuses any other — named as kubeconform's
// kubernetes-json-schema layout names them, e.g. deployment-apps-v1.json.
// That is what openapi2jsonschema does for the schemas kubeconform
// downloads by default.

// swaggerDoc is the part of an OpenAPI v2 document the conversion reads.
type swaggerDoc struct {
	Definitions map[string]map[string]any `json:"definitions"`
}

// gvk is an x-kubernetes-group-version-kind entry.
type gvk struct{ Group, Version, Kind string }

// writeKubeSchemas converts swagger (swagger.json's bytes) into dir and
// returns how many kinds it wrote.
func writeKubeSchemas(swagger []byte, dir string) (int, error) {
	var doc swaggerDoc
	if err := json.Unmarshal(swagger, &doc); err != nil {
		return 0, fmt.Errorf("swagger.json: %w", err)
	}
	c := converter{defs: doc.Definitions, done: map[string]any{}}
	n := 0
	for name, def := range doc.Definitions {
		for _, k := range kindsOf(def) {
			schema, ok := c.definition(name, nil).(map[string]any)
			if !ok {
				return n, fmt.Errorf("%s: not an object schema", name)
			}
			schema = withKind(schema, k)
			b, err := json.Marshal(schema)
			if err != nil {
				return n, err
			}
			if err := os.WriteFile(filepath.Join(dir, schemaFile(k)), b, 0o600); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// schemaFile is kubeconform's name of a kind's schema:
// {{ .ResourceKind }}{{ .KindSuffix }}.json — the kind in lower case, then
// the first label of the API group (none for the core group) and the
// version.
func schemaFile(k gvk) string {
	suffix := "-" + strings.ToLower(k.Version)
	if k.Group != "" {
		suffix = "-" + strings.ToLower(strings.Split(k.Group, ".")[0]) + suffix
	}
	return strings.ToLower(k.Kind) + suffix + ".json"
}

func kindsOf(def map[string]any) []gvk {
	list, _ := def["x-kubernetes-group-version-kind"].([]any)
	var out []gvk
	for _, e := range list {
		m, _ := e.(map[string]any)
		g, _ := m["group"].(string)
		v, _ := m["version"].(string)
		k, _ := m["kind"].(string)
		if v != "" && k != "" {
			out = append(out, gvk{g, v, k})
		}
	}
	return out
}

// withKind pins apiVersion and kind of a top-level schema to the one kind
// it is written for (a definition may serve several, e.g. DeleteOptions).
func withKind(schema map[string]any, k gvk) map[string]any {
	out := make(map[string]any, len(schema))
	for key, v := range schema {
		out[key] = v
	}
	props := map[string]any{}
	if p, ok := schema["properties"].(map[string]any); ok {
		for key, v := range p {
			props[key] = v
		}
	}
	apiVersion := k.Version
	if k.Group != "" {
		apiVersion = k.Group + "/" + k.Version
	}
	props["apiVersion"] = map[string]any{"type": "string", "enum": []any{apiVersion}}
	props["kind"] = map[string]any{"type": "string", "enum": []any{k.Kind}}
	out["properties"] = props
	return out
}

// converter inlines definitions; a definition that refers to itself
// (JSONSchemaProps) becomes {} at the point of recursion.
type converter struct {
	defs map[string]map[string]any
	done map[string]any
}

const (
	refPrefix = "#/definitions/"
	quantity  = "io.k8s.apimachinery.pkg.api.resource.Quantity"
)

func (c *converter) definition(name string, stack []string) any {
	if s, ok := c.done[name]; ok {
		return s
	}
	for _, s := range stack {
		if s == name {
			return map[string]any{}
		}
	}
	if name == quantity {
		// A string in the document, a number in many manifests (cpu: 1).
		return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}}
	}
	def, ok := c.defs[name]
	if !ok {
		return map[string]any{}
	}
	s := c.node(def, append(stack, name))
	if len(stack) == 0 || !c.recursive(name) {
		c.done[name] = s
	}
	return s
}

// recursive reports whether a definition refers to itself, directly or not
// (its inlined form then depends on where the recursion was cut).
func (c *converter) recursive(name string) bool {
	seen := map[string]bool{}
	var walk func(v any) bool
	walk = func(v any) bool {
		switch t := v.(type) {
		case map[string]any:
			if ref, ok := t["$ref"].(string); ok {
				target := strings.TrimPrefix(ref, refPrefix)
				if target == name {
					return true
				}
				if !seen[target] {
					seen[target] = true
					if walk(c.defs[target]) {
						return true
					}
				}
			}
			for _, x := range t {
				if walk(x) {
					return true
				}
			}
		case []any:
			for _, x := range t {
				if walk(x) {
					return true
				}
			}
		}
		return false
	}
	return walk(c.defs[name])
}

func (c *converter) node(v map[string]any, stack []string) any {
	if ref, ok := v["$ref"].(string); ok {
		return c.definition(strings.TrimPrefix(ref, refPrefix), stack)
	}
	switch v["format"] {
	case "int-or-string":
		return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}
	}
	out := map[string]any{}
	for key, val := range v {
		switch {
		case strings.HasPrefix(key, "x-kubernetes-"), key == "description", key == "format":
			// Documentation and Kubernetes extensions: not validation.
		case key == "properties":
			props := map[string]any{}
			for p, s := range val.(map[string]any) {
				props[p] = c.node(s.(map[string]any), stack)
			}
			out[key] = props
		case key == "items" || key == "additionalProperties":
			if m, ok := val.(map[string]any); ok {
				out[key] = c.node(m, stack)
			} else {
				out[key] = val
			}
		default:
			out[key] = val
		}
	}
	if _, ok := out["properties"]; ok {
		if _, set := out["additionalProperties"]; !set {
			out["additionalProperties"] = false
		}
	}
	return out
}
