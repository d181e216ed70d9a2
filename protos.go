// Package mandate holds what an adopter's build needs from this repository
// besides Go packages: the contract's .proto files and the third-party
// .proto files they import, with those files' licences. `mandate proto
// export DIR` writes them out (docs/adopting.md).
package mandate

import "embed"

// Protos holds proto/mandate/v1/*.proto (the declaration options, the
// refusal detail, the receipt service and the services' APIs) and
// third_party/ (buf/validate/validate.proto and google/api/*.proto, each
// tree with its LICENSE and SOURCE).
//
//go:embed proto/mandate/v1/*.proto third_party
var Protos embed.FS
