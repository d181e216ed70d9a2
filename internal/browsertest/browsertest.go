// Package browsertest finds the headless Chromium that the screenshot and
// page tests drive, for every package that has such tests.
package browsertest

import (
	"os"
	"os/exec"
	"testing"
)

// Chromium returns a Chromium or Chrome binary: MANDATE_CHROMIUM if set,
// else the first of the usual names on PATH. Without one it skips the test
// saying how to get one, or fails it when MANDATE_REQUIRE_BROWSER=1 (CI
// sets it, so that a missing browser is never a silent pass).
func Chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("MANDATE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("MANDATE_REQUIRE_BROWSER") == "1" {
		t.Fatal("MANDATE_REQUIRE_BROWSER=1 but no Chromium found (apt-get install -y chromium)")
	}
	t.Skip("browser test skipped: no Chromium found (install it with `apt-get install -y chromium`, or point MANDATE_CHROMIUM at a binary)")
	return ""
}
