// Package identity answers "who is calling?" for every Mandate service. It
// verifies JWT bearer tokens (HS256 with a dev secret for `mandate dev`;
// RS256, ES256 and EdDSA through a JWKS file or an OIDC issuer in production)
// with go-jose, checks expiry, issuer and audience, and turns the claims into
// a Principal: a user (`sub`, `tenant`, `org`), an agent acting for a user
// (RFC 8693 `act` claim: `{"sub": "<agent id>", "mandate_model": "...",
// "mandate_model_version": "..."}`), or a service (`sub: "service:<name>"`
// plus `mandate_service: "<name>"`, signed with a separate service secret).
// User and service tokens are kept apart in both directions so that neither
// can stand in for the other. Services call each other with their own token
// and forward the end user's original token in `x-mandate-on-behalf-of`; the
// gRPC interceptors and the HTTP middleware here verify both and put the end
// user's Principal (with Via set to the calling service) in the context.
// Every refusal is an *Error with a stable `authentication.*` code from the
// `authenticate` stage (docs/architecture/identity.md), and it never echoes
// the token or a key.
// Each verifier remembers the tokens it has verified — by SHA-256, at most
// DefaultCacheSize, never past their `exp`, forgotten when the keys change —
// so a token is checked once per process, not on every hop of every call.
// Whether its user or agent is still active is not a question for this
// package: the executor asks the directory on every call.
package identity
