// Package suggest names the known word a mistyped one was probably meant
// to be, for errors and warnings that say "did you mean …?" (an unknown
// MANDATE_* variable, a permission no command declares).
package suggest

// Nearest returns the name of names nearest to s in edits (Levenshtein,
// over bytes: the names it serves are ASCII), when it is at most limit
// edits away (a limit below 1 counts as 1); "" otherwise.
func Nearest(s string, names []string, limit int) string {
	best, bestD := "", -1
	for _, n := range names {
		if d := Distance(s, n); bestD < 0 || d < bestD {
			best, bestD = n, d
		}
	}
	if bestD < 0 || bestD > max(1, limit) {
		return ""
	}
	return best
}

// Distance is the Levenshtein distance of a and b, in bytes.
func Distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
