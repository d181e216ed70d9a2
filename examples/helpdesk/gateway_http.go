package helpdesk

import (
	"encoding/json"
	"net/http"
)

// GatewayCounters is what CountersHandler reports: how many refunds the fake gateway accepted
// and how much it was asked to move, in minor units per currency.
type GatewayCounters struct {
	Refunds int              `json:"refunds"`
	Moved   map[string]int64 `json:"moved"`
}

// CountersHandler serves the gateway's counters as JSON, read-only. The helpdesk process
// mounts it so that a test driving the backend as a separate process can prove how much money
// moved; the fake gateway moves nothing, and the counters name no tenant, ticket or card.
func (g *Gateway) CountersHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(GatewayCounters{Refunds: g.Refunds(), Moved: g.Moved()})
	})
}
