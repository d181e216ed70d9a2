package jsonschema_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/mandate-dev/mandate/internal/compile/compiletest"
	"github.com/mandate-dev/mandate/internal/schema/jsonschema"
)

const integersProto = `syntax = "proto3";
package test.integers.v1;
import "buf/validate/validate.proto";
message Integers {
  int64 open = 1;
  int64 gt_lte = 2 [(buf.validate.field).int64 = {gt: 0, lte: 100000000}];
  int64 gte = 3 [(buf.validate.field).int64.gte = 5];
  int64 lt = 4 [(buf.validate.field).int64.lt = 10];
  int64 exact = 5 [(buf.validate.field).int64.const = 7];
  int64 listed = 6 [(buf.validate.field).int64 = {in: [1, 2]}];
  int64 outside = 7 [(buf.validate.field).int64 = {gt: 10, lt: 5}];
  int64 not_listed = 8 [(buf.validate.field).int64 = {not_in: [3]}];
  uint64 u_lt = 9 [(buf.validate.field).uint64.lt = 10];
  int32 i32_gt = 10 [(buf.validate.field).int32.gt = 0];
  sint32 i32_open = 11;
}
`

// integersMessage compiles integersProto and returns its message.
func integersMessage(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "integers.proto"), []byte(integersProto), 0o600); err != nil {
		t.Fatal(err)
	}
	fds := compiletest.Protos(t, dir, "integers.proto")
	// Through the wire format, so buf.validate options resolve to the
	// linked-in extension types, as compile.Compile reads them.
	raw, err := proto.Marshal(fds)
	if err != nil {
		t.Fatal(err)
	}
	set := new(descriptorpb.FileDescriptorSet)
	if err := (proto.UnmarshalOptions{Resolver: protoregistry.GlobalTypes}).Unmarshal(raw, set); err != nil {
		t.Fatal(err)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatal(err)
	}
	d, err := files.FindDescriptorByName("test.integers.v1.Integers")
	if err != nil {
		t.Fatal(err)
	}
	return d.(protoreflect.MessageDescriptor)
}

// TestIntegerBounds checks that an integer field's JSON-number schema
// bounds each side either by the rule or, where the rule leaves it open,
// by the type's limit, never by both.
func TestIntegerBounds(t *testing.T) {
	md := integersMessage(t)
	const (
		min64 = "-9223372036854775808"
		max64 = "9223372036854775807"
	)
	cases := []struct {
		field string
		mode  jsonschema.Mode
		want  map[string]any // the JSON-number branch, without "type"
	}{
		{"open", jsonschema.Input, map[string]any{"minimum": min64, "maximum": max64}},
		{"gt_lte", jsonschema.Input, map[string]any{"exclusiveMinimum": "0", "maximum": "100000000"}},
		{"gte", jsonschema.Input, map[string]any{"minimum": "5", "maximum": max64}},
		{"lt", jsonschema.Input, map[string]any{"minimum": min64, "exclusiveMaximum": "10"}},
		{"exact", jsonschema.Input, map[string]any{"const": "7"}},
		{"listed", jsonschema.Input, map[string]any{"enum": []any{"1", "2"}}},
		{"outside", jsonschema.Input, map[string]any{"minimum": min64, "maximum": max64, "anyOf": []any{
			map[string]any{"exclusiveMaximum": "5"}, map[string]any{"exclusiveMinimum": "10"},
		}}},
		{"not_listed", jsonschema.Input, map[string]any{"minimum": min64, "maximum": max64, "not": map[string]any{"enum": []any{"3"}}}},
		{"u_lt", jsonschema.Input, map[string]any{"minimum": "0", "exclusiveMaximum": "10"}},
		{"i32_gt", jsonschema.Input, map[string]any{"exclusiveMinimum": "0", "maximum": "2147483647"}},
		{"i32_open", jsonschema.Input, map[string]any{"minimum": "-2147483648", "maximum": "2147483647"}},
		// Output schemas state the type, never the input rules.
		{"i32_gt", jsonschema.Output, map[string]any{"minimum": "-2147483648", "maximum": "2147483647"}},
	}
	built := map[jsonschema.Mode]map[string]any{}
	for _, mode := range []jsonschema.Mode{jsonschema.Input, jsonschema.Output} {
		s, err := jsonschema.Build(md, mode)
		if err != nil {
			t.Fatal(err)
		}
		built[mode] = roundTrip(t, s)["properties"].(map[string]any)
	}
	for _, tc := range cases {
		name := tc.field
		if tc.mode == jsonschema.Output {
			name += " output"
		}
		t.Run(name, func(t *testing.T) {
			field := built[tc.mode][tc.field].(map[string]any)
			num := field
			if anyOf, ok := field["anyOf"].([]any); ok && field["type"] == nil {
				num = anyOf[0].(map[string]any) // 64-bit: JSON number or decimal string
			}
			got := map[string]any{}
			for k, v := range num {
				if k != "type" && k != "description" {
					got[k] = v
				}
			}
			if num["type"] != "integer" || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("schema %v, want type integer and %v", num, tc.want)
			}
		})
	}
}

// roundTrip returns s as generic JSON with numbers kept as their strings.
func roundTrip(t *testing.T, s jsonschema.Schema) map[string]any {
	t.Helper()
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return stringifyNumbers(out).(map[string]any)
}

func stringifyNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		return x.String()
	case map[string]any:
		for k, e := range x {
			x[k] = stringifyNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = stringifyNumbers(e)
		}
	}
	return v
}
