// Package failure is the one place where Mandate errors become wire errors,
// and holds the one table of the codes they carry.
//
// A refusal or fault is an *Error with a pipeline stage and a stable code
// (docs/architecture/pipeline.md); ToStatus turns any error into a gRPC status carrying
// google.rpc.ErrorInfo and mandate.v1.CommandError, and Problem turns a
// status into an RFC 9457 problem+json body with the same code string. Raw
// internal errors never reach a client: they become a generic
// `internal.error` after being logged by the caller.
//
// # The table of codes
//
// Every code Mandate emits is a Code* constant and a row of the table
// (Lookup, Codes): the stages that report it, its gRPC code, its HTTP
// status, whether a retry may succeed, and the default remedy. The gRPC
// code of an *Error comes from the table (GRPCCode), never from the shape
// of the code. A backend's domain codes (refund.exceeds_paid in the sample)
// are not Mandate's and are not in the table: a backend sets Error.Status,
// and Mandate passes the refusal on with the backend's gRPC code. An
// *Error without Status whose code the table lacks is UnknownCode
// (Internal).
//
// # Adding a code
//
//  1. Add a constant CodeNamespaceName = "namespace.name" in codes.go. The
//     namespace is the subject the code is about (schema, idempotency,
//     confirmation, …); reuse one where it fits.
//  2. Add its row to the table: the stages that report it, the gRPC code,
//     the HTTP status (HTTPStatus of the gRPC code unless the REST gateway
//     answers it itself), Retriable, a Remedy (required when retriable) and
//     a one-line Meaning. A code that is only recorded in the audit trail
//     has neither gRPC code nor HTTP status.
//  3. Run `go generate ./internal/failure` to rewrite the README's table of
//     codes between its markers.
//  4. Use the constant, never the string: a test fails on a code-shaped
//     string literal outside this package, and another on a row that breaks
//     the rules above or a README that differs from the table.
//
// A code, once published, never changes meaning: clients, often agents,
// branch on it, and the audit trail keeps it.
package failure

//go:generate go run ./cmd/codestable -readme ../../README.md
