// Package restgateway serves the REST routes (google.api.http) of a
// deployment's commands from its descriptor set, as protoc-gen-grpc-gateway
// would have generated them: the executor cannot link the generated
// gateway of a backend it has never seen, but it holds every command's
// method descriptor, and that is all the generated code knows.
//
// Each route is registered on the server's grpc-gateway mux, so it shares
// the server's middleware (authentication before the body is read, the
// checks of hostile input), its marshaler (protojson, proto names, unset
// fields emitted), its header matcher (Idempotency-Key,
// X-Mandate-Approval-Grant, X-Mandate-Conversation, the bearer token) and
// its one problem+json error handler. A request is decoded into a dynamic
// message of the method's input type and sent, on the server's own gRPC
// connection, to the command's method: the executor's governed proxy runs
// it through the pipeline exactly as it runs a call of the generated
// gateway. docs/rest.md describes the binding rules.
package restgateway
