package memory_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/services/audit"
	"github.com/mandate-dev/mandate/services/audit/audittest"
	"github.com/mandate-dev/mandate/services/audit/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	audittest.Run(t, func(t *testing.T) audit.Store {
		s := memory.New(memory.Options{})
		t.Cleanup(s.Close)
		return s
	})
}
