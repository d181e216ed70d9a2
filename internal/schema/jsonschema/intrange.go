package jsonschema

import (
	"math/big"
	"strings"
)

// intRangePattern returns an anchored regular expression that matches the
// canonical decimal spelling (no leading zeros, no plus sign, no "-0") of
// every integer in [lo, hi]. A nil bound is open. JSON Schema cannot compare
// strings numerically, so 64-bit integers spelled as strings are range
// checked with this pattern instead.
//
// An open side is bounded by maxDigits digits instead, which keeps patterns
// short for 64-bit fields without declared bounds.
func intRangePattern(lo, hi *big.Int, maxDigits int) string {
	var alts []string
	zero := big.NewInt(0)
	// Negative part: -x for x in [max(1, -hi), -lo].
	if lo == nil || lo.Sign() < 0 {
		var nlo, nhi *big.Int
		nlo = big.NewInt(1)
		if hi != nil && hi.Sign() < 0 {
			nlo = new(big.Int).Neg(hi)
		}
		if lo != nil {
			nhi = new(big.Int).Neg(lo)
		}
		for _, a := range natRange(nlo, nhi, maxDigits) {
			alts = append(alts, "-"+a)
		}
	}
	// Non-negative part: x in [max(0, lo), hi].
	if hi == nil || hi.Sign() >= 0 {
		plo := zero
		if lo != nil && lo.Sign() > 0 {
			plo = lo
		}
		alts = append(alts, natRange(plo, hi, maxDigits)...)
	}
	if len(alts) == 0 {
		return "^$.^" // empty range: matches nothing
	}
	return "^(?:" + strings.Join(alts, "|") + ")$"
}

// natRange returns alternatives matching the naturals in [lo, hi]; hi nil is
// bounded by maxDigits. lo must be non-negative.
func natRange(lo, hi *big.Int, maxDigits int) []string {
	if hi != nil && lo.Cmp(hi) > 0 {
		return nil
	}
	los := lo.String()
	var alts []string
	if hi == nil {
		// Same length as lo, from lo up to all nines, then any longer number.
		alts = append(alts, sameLength(los, strings.Repeat("9", len(los)))...)
		if len(los) < maxDigits {
			alts = append(alts, "[1-9][0-9]{"+itoa(len(los))+","+itoa(maxDigits-1)+"}")
		}
		return alts
	}
	his := hi.String()
	for n := len(los); n <= len(his); n++ {
		a, b := los, his
		if n > len(los) {
			a = "1" + strings.Repeat("0", n-1)
		}
		if n < len(his) {
			b = strings.Repeat("9", n)
		}
		alts = append(alts, sameLength(a, b)...)
	}
	return alts
}

// sameLength matches the numbers between a and b, two digit strings of equal
// length with a <= b.
func sameLength(a, b string) []string {
	if a == "" {
		return []string{""}
	}
	if strings.Trim(a[1:], "0") == "" && strings.Trim(b[1:], "9") == "" {
		return []string{digitClass(a[0], b[0]) + anyDigits(len(a)-1)}
	}
	if a[0] == b[0] {
		var out []string
		for _, s := range sameLength(a[1:], b[1:]) {
			out = append(out, a[:1]+s)
		}
		return out
	}
	n := len(a) - 1
	var out []string
	nines, zeros := strings.Repeat("9", n), strings.Repeat("0", n)
	for _, s := range sameLength(a[1:], nines) {
		out = append(out, a[:1]+s)
	}
	if b[0]-a[0] > 1 {
		out = append(out, digitClass(a[0]+1, b[0]-1)+anyDigits(n))
	}
	for _, s := range sameLength(zeros, b[1:]) {
		out = append(out, b[:1]+s)
	}
	return out
}

func digitClass(from, to byte) string {
	if from == to {
		return string(from)
	}
	return "[" + string(from) + "-" + string(to) + "]"
}

func anyDigits(n int) string {
	switch n {
	case 0:
		return ""
	case 1:
		return "[0-9]"
	default:
		return "[0-9]{" + itoa(n) + "}"
	}
}

func itoa(n int) string { return big.NewInt(int64(n)).String() }
