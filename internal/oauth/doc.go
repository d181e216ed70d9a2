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
// a headless agent of that user: the app's own answers to confirmation forms
// are not the user's, who approves on the approval page, signed in. Only if
// the user ticks the consent page's opt-in ("this app asks me in its own
// window, and my answer there counts as mine — up to risk L<ceiling>") is
// the agent interactive, and even then the confirm service counts its
// answers only up to the tenant's trust ceiling. The access token is the JWT
// every Mandate service already verifies: the user as `sub`, the agent in
// the RFC 8693 `act` claim, no model.
//
// Revocation is the directory's: revoking any token of a client (RFC 7009),
// or replaying a used authorization code or refresh token, disables the
// agent and records when. Every service refuses a token issued before that
// instant, and the confirm service a grant asked for before it — also after
// the user approves the client again, which re-enables the agent for new
// tokens only.
//
// A client ID metadata document is fetched by whoever names its URL at the
// authorization endpoint, without a credential, so the fetch is bounded:
// https only, and each connection goes to a public unicast address, judged
// by the dialer on the address resolved (no loopback, private, link-local,
// multicast or other special-purpose one; loopback and plain http on a
// loopback host only in loopback-dev, Config.LoopbackDev); no proxy, no
// redirect followed, a timeout, 5 KiB of document. A failure is remembered
// for a minute, so asking again does not fetch again; fetches are rate
// limited per client address and in all; and every way a fetch fails gets
// the same error page, so it tells nothing of what the URL answered.
//
// State (clients, codes, refresh tokens, sign-ins) lives in memory: it is a
// development server, and a restart makes clients register again. In
// production the bridge names the deployment's OIDC issuer instead.
package oauth
