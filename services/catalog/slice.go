package catalog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// commandSlices cuts a manifest into its commands' JSON objects, each
// exactly as it appears in the manifest bytes (json.RawMessage receives the
// value's bytes verbatim), keyed by code.
func commandSlices(raw []byte) (map[string][]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := expectDelim(dec, '{'); err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("manifest slices: %w", err)
		}
		if key != "commands" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, fmt.Errorf("manifest slices: %w", err)
			}
			continue
		}
		if err := expectDelim(dec, '['); err != nil {
			return nil, err
		}
		for dec.More() {
			var obj json.RawMessage
			if err := dec.Decode(&obj); err != nil {
				return nil, fmt.Errorf("manifest slices: %w", err)
			}
			var head struct {
				Code string `json:"code"`
			}
			if err := json.Unmarshal(obj, &head); err != nil || head.Code == "" {
				return nil, errors.New("manifest slices: a command without a code")
			}
			out[head.Code] = obj
		}
		if err := expectDelim(dec, ']'); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("manifest slices: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("manifest slices: want %q, got %v", want, tok)
	}
	return nil
}
