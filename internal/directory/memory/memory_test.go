package memory_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/internal/directory"
	"github.com/mandate-dev/mandate/internal/directory/directorytest"
	"github.com/mandate-dev/mandate/internal/directory/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	directorytest.Run(t, func(t *testing.T) directory.Store { return memory.New() })
}
