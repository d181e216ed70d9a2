package schema_test

import (
	"testing"

	"github.com/mandate-dev/mandate/internal/schema"
)

// TestDecodersShareTheValidator: the process has one validator, and a new
// decoder builds none of its own (a CEL environment describing every
// linked protobuf file: thousands of allocations, about 1 MB kept).
func TestDecodersShareTheValidator(t *testing.T) {
	v1, err := schema.Validator()
	if err != nil {
		t.Fatal(err)
	}
	v2, err := schema.Validator()
	if err != nil {
		t.Fatal(err)
	}
	if v1 != v2 {
		t.Fatal("Validator built a second validator")
	}
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	allocs := testing.AllocsPerRun(3, func() {
		if _, err := schema.NewDecoder(nil, schema.Limits{}); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 5 {
		t.Fatalf("NewDecoder allocates %.0f times, want a handful: it builds a validator of its own", allocs)
	}
}
