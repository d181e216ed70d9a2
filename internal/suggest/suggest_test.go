package suggest

import "testing"

func TestNearest(t *testing.T) {
	names := []string{"payment.refund", "ticket.read", "stock.approve"}
	for _, c := range []struct {
		s     string
		limit int
		want  string
	}{
		{"payment.refnd", 4, "payment.refund"},
		{"stock.aprove", 4, "stock.approve"},
		{"ticket.read", 0, "ticket.read"},
		{"something.else", 4, ""},
		{"tiket.red", 1, ""}, // two edits, one allowed
	} {
		if got := Nearest(c.s, names, c.limit); got != c.want {
			t.Errorf("Nearest(%q, %d) = %q, want %q", c.s, c.limit, got, c.want)
		}
	}
	if Nearest("x", nil, 3) != "" {
		t.Error("a suggestion out of no names")
	}
	for _, tc := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"abc", "abc", 0}, {"abc", "abd", 1}, {"abc", "ab", 1}, {"kitten", "sitting", 3}} {
		if got := Distance(tc.a, tc.b); got != tc.want {
			t.Errorf("Distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
