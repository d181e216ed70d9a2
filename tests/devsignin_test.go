package tests

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
)

// TestDevSignInAgain: a newcomer who used (or lost) the one-time sign-in
// links `mandate dev` printed is not locked out: /dev/sign-in lists the
// policy's people and hands out a fresh one-time link per visit, which
// signs in once; a used link still refuses.
func TestDevSignInAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dev := startDev(t)
	if !strings.Contains(dev.out.String(), "Fresh ones at "+dev.base+"/dev/sign-in") {
		t.Fatal("the banner does not say where fresh sign-in links are")
	}
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(c *http.Client, u string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, u, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Location"), string(b)
	}
	if code, _, page := get(noFollow, dev.base+"/dev/sign-in"); code != http.StatusOK || !strings.Contains(page, `id="signin-acme-carol"`) || strings.Contains(page, "finance-bot") {
		t.Fatalf("the list: %d\n%s", code, page)
	}
	fresh := func() string {
		t.Helper()
		code, loc, _ := get(noFollow, dev.base+"/dev/sign-in?user=carol&tenant=acme")
		if code != http.StatusSeeOther || !strings.Contains(loc, "/approve/login?t=") {
			t.Fatalf("a fresh link: %d %q", code, loc)
		}
		return loc
	}
	first, second := fresh(), fresh()
	if first == second {
		t.Fatal("the same link twice")
	}
	signIn := func(link string) (int, string) {
		jar, _ := cookiejar.New(nil)
		code, _, page := get(&http.Client{Jar: jar}, link)
		return code, page
	}
	if code, page := signIn(first); code != http.StatusOK || !strings.Contains(page, "signed in as carol") {
		t.Fatalf("signing in with a fresh link: %d\n%s", code, page)
	}
	if _, page := signIn(first); strings.Contains(page, "signed in as carol") {
		t.Fatal("a used link signed in again")
	}
	if code, page := signIn(second); code != http.StatusOK || !strings.Contains(page, "signed in as carol") {
		t.Fatalf("the second fresh link: %d\n%s", code, page)
	}
	if code, _, _ := get(noFollow, dev.base+"/dev/sign-in?user=mallory"); code != http.StatusNotFound {
		t.Fatalf("an unknown person: %d", code)
	}
}
