// Package oauth is the OAuth 2.1 authorization server of `mandate dev`: what
// lets an MCP host (Claude Code, VS Code, Cursor, the MCP Inspector) connect
// to the bridge with one command, by discovery, instead of a copied token.
//
// It serves RFC 8414 metadata, dynamic client registration (RFC 7591) and
// client ID metadata documents, the authorization code grant with PKCE (S256
// only), refresh tokens (rotated, bound to their client, reuse revokes the
// family) and revocation (RFC 7009). At the authorization endpoint the human
// signs in with the dev sign-in (a demo user picked on a page served to this
// machine only) and approves or denies, on a CSRF-protected consent page
// that names the client. Approving registers the client in the directory as
// an interactive agent of that user (the user is at the keyboard), and the
// access token is the JWT every Mandate service already verifies: the user
// as `sub`, the agent in the RFC 8693 `act` claim, no model.
//
// Revocation is the directory's: revoking any token of a client (RFC 7009)
// disables the agent, so the executor, which resolves the directory on every
// call, refuses its next call at once, whatever access tokens are still
// outstanding. Approving the client again re-enables it.
//
// State (clients, codes, refresh tokens, sign-ins) lives in memory: it is a
// development server, and a restart makes clients register again. In
// production the bridge names the deployment's OIDC issuer instead.
package oauth
