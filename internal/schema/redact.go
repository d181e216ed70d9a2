package schema

import (
	"bytes"
	"encoding/json"
	"sort"
	"strconv"
	"strings"
)

// Withheld replaces a sensitive value in redacted JSON.
const Withheld = "[withheld]"

// Redact returns input with the values at the given JSON pointers (proto
// field names; "*" matches any list element or map key) replaced by
// Withheld, and the concrete pointers that were withheld, sorted. Input that
// is not a JSON object is returned as an empty object: redaction never
// passes through what it cannot read.
func Redact(input []byte, pointers []string) ([]byte, []string) {
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return []byte("{}"), nil
	}
	if _, ok := doc.(map[string]any); !ok {
		return []byte("{}"), nil
	}
	var withheld []string
	for _, p := range pointers {
		parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
		redactAt(doc, parts, "", &withheld)
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return []byte("{}"), nil
	}
	sort.Strings(withheld)
	return out, withheld
}

func redactAt(v any, parts []string, prefix string, withheld *[]string) {
	if len(parts) == 0 {
		return
	}
	head, rest := parts[0], parts[1:]
	visit := func(key string, child any, set func(any)) {
		p := prefix + "/" + escapePointer(key)
		if len(rest) == 0 {
			set(Withheld)
			*withheld = append(*withheld, p)
			return
		}
		redactAt(child, rest, p, withheld)
	}
	switch x := v.(type) {
	case map[string]any:
		if head == "*" {
			for k, child := range x {
				visit(k, child, func(nv any) { x[k] = nv })
			}
			return
		}
		key := strings.ReplaceAll(strings.ReplaceAll(head, "~1", "/"), "~0", "~")
		if child, ok := x[key]; ok {
			visit(key, child, func(nv any) { x[key] = nv })
		}
	case []any:
		if head != "*" {
			return
		}
		for i, child := range x {
			visit(strconv.Itoa(i), child, func(nv any) { x[i] = nv })
		}
	}
}
