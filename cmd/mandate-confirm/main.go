// Command mandate-confirm runs the confirm service and its approval pages alone: the same flags and MANDATE_*
// variables as `mandate confirm`, in a binary that links no other service,
// so that an idle process maps less code. Migrations and the operator
// tools stay in the all-in-one mandate binary. Build it with
// -tags grpcnotrace, as `make binaries` does: Mandate never enables gRPC's
// x/net/trace, and the linker drops some 5 MB of methods that
// html/template would keep alive. The approval pages write their HTML by
// hand (services/confirm/page) for the same reason; internal/archtest
// keeps html/template, and any call of a method by a run-time name, out
// of this binary.
package main

import (
	"os"

	"github.com/mandate-dev/mandate/internal/app/clicore"
	"github.com/mandate-dev/mandate/internal/app/confirmcmd"
)

func main() { os.Exit(clicore.Main("mandate-confirm", confirmcmd.Run)) }
