// Command mandate-audit runs the audit service alone: the same flags and MANDATE_*
// variables as `mandate audit`, in a binary that links no other service,
// so that an idle process maps less code. Migrations and the operator
// tools stay in the all-in-one mandate binary.
package main

import (
	"os"

	"github.com/mandate-dev/mandate/internal/cli/auditcmd"
	"github.com/mandate-dev/mandate/internal/cli/clicore"
)

func main() { os.Exit(clicore.Main("mandate-audit", auditcmd.Run)) }
