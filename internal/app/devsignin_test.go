package app

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestDevSignInOnlyOnThisMachine: the development sign-in hands out links
// to loopback requests only.
func TestDevSignInOnlyOnThisMachine(t *testing.T) {
	h := devSignIn("http://127.0.0.1:8080", []byte("0123456789abcdef0123456789abcdef"), []devPrincipal{{name: "carol", tenant: "acme", user: "carol"}})
	for addr, want := range map[string]int{"10.0.0.7:51000": http.StatusForbidden, "[2001:db8::1]:443": http.StatusForbidden, "127.0.0.1:51000": http.StatusSeeOther} {
		req := httptest.NewRequest(http.MethodGet, DevSignInPath+"?user=carol", nil)
		req.RemoteAddr = addr
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("from %s: %d, want %d", addr, rec.Code, want)
		}
	}
}
