package jsonschema

import (
	"math/big"
	"regexp"
	"strconv"
	"testing"
)

func TestIntRangePattern(t *testing.T) {
	bi := func(v int64) *big.Int { return big.NewInt(v) }
	cases := []struct {
		name   string
		lo, hi *big.Int
	}{
		{"closed positive", bi(1), bi(100000000)},
		{"closed across zero", bi(-250), bi(1234)},
		{"negative only", bi(-9000), bi(-17)},
		{"open above", bi(37), nil},
		{"open below", nil, bi(-3)},
		{"single", bi(42), bi(42)},
		{"zero to nine", bi(0), bi(9)},
		{"open both", nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			re := regexp.MustCompile(intRangePattern(tc.lo, tc.hi, 19))
			for v := int64(-20000); v <= 20000; v++ {
				want := (tc.lo == nil || tc.lo.Int64() <= v) && (tc.hi == nil || v <= tc.hi.Int64())
				s := strconv.FormatInt(v, 10)
				if got := re.MatchString(s); got != want {
					t.Fatalf("%s: match(%s) = %v, want %v", re, s, got, want)
				}
			}
			for _, s := range []string{"007", "-0", "+5", "", "1e2", "5.0", " 5"} {
				if re.MatchString(s) {
					t.Fatalf("%s matched non-canonical %q", re, s)
				}
			}
		})
	}
	// An open side stops at maxDigits digits.
	open := regexp.MustCompile(intRangePattern(nil, nil, 19))
	if !open.MatchString("-9999999999999999999") || open.MatchString("10000000000000000000") {
		t.Fatalf("open range %s does not stop at 19 digits", open)
	}
	// The 64-bit limits are exact.
	re := regexp.MustCompile(intRangePattern(bi(-9223372036854775808), bi(9223372036854775807), 19))
	for s, want := range map[string]bool{"9223372036854775807": true, "9223372036854775808": false, "-9223372036854775808": true, "-9223372036854775809": false, "10000000000000000000": false} {
		if re.MatchString(s) != want {
			t.Fatalf("int64 limits: match(%s) != %v", s, want)
		}
	}
}
