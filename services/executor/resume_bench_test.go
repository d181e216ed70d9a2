package executor

import (
	"errors"
	"testing"

	"github.com/mandate-dev/mandate/internal/failure"
)

// BenchmarkApprovedCallSchema is schema_validate for the approved call of
// the sample's refund: full (nothing parked under its grant: decode,
// validate, encode, redact) and resumed (restored from the parked call).
// The store is the in-memory fake: a Postgres store adds one read.
func BenchmarkApprovedCallSchema(b *testing.B) {
	bot := testPrincipal("acme", "carol", "finance-bot")
	h := newStageHarness(b)
	ctx, asked := h.prepared(b, bot, Call{Code: "ticket.refund", Input: []byte(refundArgs), Channel: "mcp"}, StageConfirmation, false)
	res, err := h.run(b, ctx, asked, StageConfirmation)
	if res != nil || !errors.Is(err, &failure.Error{Code: failure.CodeConfirmationRequired}) {
		b.Fatalf("the asked call: %v, %v", res, err)
	}
	for _, bc := range []struct {
		name, grant string
		resumed     bool
	}{{"full", "ch-none", false}, {"resumed", "ch-1", true}} {
		b.Run(bc.name, func(b *testing.B) {
			_, base := h.prepared(b, bot, Call{Code: "ticket.refund", Input: []byte(refundArgs), Channel: "mcp", GrantID: bc.grant}, StageSchema, false)
			b.ReportAllocs()
			for b.Loop() {
				inv := *base
				if _, err := h.e.schemaValidate(ctx, &inv); err != nil || inv.resumed != bc.resumed {
					b.Fatalf("schema_validate: %v, resumed %v", err, inv.resumed)
				}
			}
		})
	}
}
