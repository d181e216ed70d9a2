package memory_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/services/confirm/confirmtest"
	"github.com/mandate-dev/mandate/services/confirm/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	confirmtest.Run(t, func(t *testing.T) confirmtest.Backend {
		s := memory.New(memory.Options{})
		t.Cleanup(s.Close)
		return s
	})
}
