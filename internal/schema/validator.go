package schema

import (
	"sync"

	"buf.build/go/protovalidate"
)

// Validator returns the process's protovalidate validator, built on first
// use: the servers' request validation (internal/server), the decoder of
// command inputs and the schema builder (internal/schema/jsonschema) all
// share it. Each protovalidate.New builds a CEL environment that describes
// every protobuf file linked into the binary, about 1 MB of heap held for
// the process's lifetime; one validator is safe for concurrent use and
// caches what it compiles per message descriptor, so sharing it changes no
// verdict. An error building it is returned to every caller.
func Validator() (protovalidate.Validator, error) { return sharedValidator() }

var sharedValidator = sync.OnceValues(func() (protovalidate.Validator, error) { return protovalidate.New() })
