// Command mandate-audit runs the audit service alone: the same flags and MANDATE_*
// variables as `mandate audit`, in a binary that links no other service,
// so that an idle process maps less code. Migrations and the operator
// tools stay in the all-in-one mandate binary. Build it with
// -tags grpcnotrace, as `make binaries` does: Mandate never enables gRPC's
// x/net/trace, and leaving it out lets the linker drop some 5 MB.
package main

import (
	"os"

	"github.com/mandate-dev/mandate/internal/app/auditcmd"
	"github.com/mandate-dev/mandate/internal/app/clicore"
)

func main() { os.Exit(clicore.Main("mandate-audit", auditcmd.Run)) }
