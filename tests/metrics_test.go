package tests

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// scrapeMetrics GETs base/metrics and returns the status and body.
func scrapeMetrics(t *testing.T, base string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, base+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMetricsServedByDefault: `mandate dev` serves the instruments of the
// OTLP export at GET /metrics without a token, in the Prometheus text
// format — after one ticket.search over REST the executor's counter and
// histogram carry it, and the audit writer's counter shows its committed
// rows (the writer commits in the background, so the scrape is retried
// until they are there, within 10 s).
func TestMetricsServedByDefault(t *testing.T) {
	d := startDev(t)
	if code, body := do(t, http.MethodPost, d.base+"/v1/commands/ticket.search:execute", d.tokens["alice"], `{"input":{"query":"refund"}}`); code != http.StatusOK {
		t.Fatalf("ticket.search: %d %v", code, body)
	}
	want := []string{
		"# TYPE mandate_executor_calls_total counter",
		`command="ticket.search"`,
		"# TYPE mandate_executor_duration_seconds histogram",
		"mandate_executor_duration_seconds_bucket{",
		"# TYPE mandate_audit_records_total counter",
		"mandate_audit_batch_size_bucket{",
		`service_name="mandate-dev"`,
	}
	var text string
	for deadline := time.Now().Add(10 * time.Second); ; {
		code, body := scrapeMetrics(t, d.base)
		if code != http.StatusOK {
			t.Fatalf("GET /metrics: %d %s", code, body)
		}
		text = body
		missing := ""
		for _, w := range want {
			if !strings.Contains(text, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %q:\n%s", missing, tail(text, 6000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	var callLine string
	for l := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(l, "mandate_executor_calls_total{") && strings.Contains(l, `command="ticket.search"`) {
			callLine = l
		}
	}
	if !strings.HasSuffix(callLine, " 1") {
		t.Errorf("ticket.search counted as %q, want 1", callLine)
	}
}

// TestMetricsSwitchedOff: --metrics=false (or MANDATE_METRICS=false) leaves
// /metrics an unknown route, answered 404 like any other.
func TestMetricsSwitchedOff(t *testing.T) {
	d := startDev(t, "--metrics=false")
	if code, body := scrapeMetrics(t, d.base); code != http.StatusNotFound {
		t.Fatalf("GET /metrics with --metrics=false: %d %s", code, tail(body, 500))
	}
}
