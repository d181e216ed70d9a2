package clicore

import (
	"github.com/mandate-dev/mandate/internal/config"
	"github.com/mandate-dev/mandate/internal/edgelimit"
)

// EdgeFlags are the request rate limit of an edge — the REST gateway, the
// MCP bridge — per principal (docs/architecture/limits.md).
type EdgeFlags struct {
	// Rate is the sustained requests per second of one principal, 0 for no
	// limit; Burst how many it may send at once.
	Rate, Burst int
}

// Default edge limits.
const (
	DefaultEdgeRate  = 100
	DefaultEdgeBurst = 200
)

// Declare adds --rate-limit and --rate-burst; what names the edge, such as
// "REST", goes in their help.
func (e *EdgeFlags) Declare(s *config.Set, what string) {
	s.Int(&e.Rate, "rate-limit", DefaultEdgeRate, "requests per second one principal (tenant, user, agent) may make to "+what+
		", sustained; past it requests are refused 429 rate.limited with Retry-After, and audited (0: no limit)")
	s.Int(&e.Burst, "rate-burst", DefaultEdgeBurst, "requests one principal may make to "+what+" at once, above --rate-limit")
	s.Check(func() error {
		switch {
		case e.Rate < 0:
			return s.Errorf("rate-limit", "must not be negative")
		case e.Burst < 1 && e.Rate > 0:
			return s.Errorf("rate-burst", "must be at least 1")
		}
		return nil
	})
}

// Limiter is the limiter the flags describe, nil without a limit.
func (e EdgeFlags) Limiter() *edgelimit.Limiter {
	return edgelimit.New(edgelimit.Config{Rate: float64(e.Rate), Burst: e.Burst})
}
