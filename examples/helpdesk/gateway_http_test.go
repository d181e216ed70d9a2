package helpdesk_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/mandate-dev/mandate/examples/helpdesk"
)

func TestGatewayCountersHandler(t *testing.T) {
	g := helpdesk.NewGateway()
	read := func() helpdesk.GatewayCounters {
		t.Helper()
		rec := httptest.NewRecorder()
		g.CountersHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/gateway/counters", nil))
		if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
		}
		var c helpdesk.GatewayCounters
		if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := read(); c.Refunds != 0 || len(c.Moved) != 0 {
		t.Fatalf("a new gateway reports %+v", c)
	}
	for _, m := range []helpdesk.Money{{Currency: "EUR", Minor: 2500}, {Currency: "EUR", Minor: 100}, {Currency: "USD", Minor: 700}} {
		if _, err := g.Refund(context.Background(), helpdesk.GatewayRefund{Reference: "acme/RF-1", Amount: m, CardholderReference: "CH4242424242"}); err != nil {
			t.Fatal(err)
		}
	}
	if c := read(); c.Refunds != 3 || c.Moved["EUR"] != 2600 || c.Moved["USD"] != 700 || len(c.Moved) != 2 {
		t.Fatalf("after three refunds: %+v", c)
	}
}
