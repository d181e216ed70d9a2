package memory_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/mandate-dev/mandate/examples/helpdesk"
	"github.com/mandate-dev/mandate/examples/helpdesk/helpdesktest"
	"github.com/mandate-dev/mandate/examples/helpdesk/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	helpdesktest.Run(t, func(*testing.T) helpdesk.Store { return memory.New() })
}
