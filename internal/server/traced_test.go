package server

import (
	"net/http/httptest"
	"testing"
)

// TestProbesAreNotTraced: health probes and metric scrapes, which arrive
// every few seconds, start no trace; every other request does.
func TestProbesAreNotTraced(t *testing.T) {
	for path, want := range map[string]bool{"/healthz": false, MetricsPath: false, "/v1/commands/x:execute": true, "/mcp": true} {
		if got := traced(httptest.NewRequest("GET", path, nil)); got != want {
			t.Errorf("traced(%s) = %v, want %v", path, got, want)
		}
	}
}
