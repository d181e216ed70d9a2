// Connects to Mandate's MCP endpoint the way an MCP host does, with no
// token: the official TypeScript SDK's OAuth client (an OAuthClientProvider
// on StreamableHTTPClientTransport) discovers the authorization server from
// the 401's WWW-Authenticate (RFC 9728 → RFC 8414), registers (RFC 7591),
// and sends the human to the authorization URL; this script serves the
// loopback redirect URI (RFC 8252), exchanges the code and then lists tools,
// calls one, revokes its token (RFC 7009) and calls again.
// tests/oauth_test.go runs it against `mandate dev` and answers the consent
// page in headless Chromium.
//
// Usage:
//   MCP_URL=http://127.0.0.1:8080/mcp node oauth.mjs
//
// Output (stdout): one JSON object per line, as things happen:
//   {"event":"authorize","url":…}       open this URL in a browser
//   {"event":"callback","query":{…}}     the redirect came back
//   {"event":"done", …}                  what the run saw (below)
// Failures print {"fatal":…} on stderr and exit 1. Tokens are never
// printed; the access token's `act.sub` (the agent) is.

import http from "node:http";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";
import { MemoryOAuthProvider } from "./provider.mjs";

const mcpURL = process.env.MCP_URL;
const timeoutMs = Number(process.env.MCP_TIMEOUT_MS || 60000);

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

function fatal(message, err) {
  const out = { fatal: message };
  if (err) {
    out.error = { name: err.name, message: String(err.message ?? err), code: err.code };
  }
  process.stderr.write(JSON.stringify(out) + "\n");
  process.exit(1);
}

if (!mcpURL) {
  fatal("MCP_URL must be set");
}
const watchdog = setTimeout(() => fatal(`timed out after ${timeoutMs} ms`), timeoutMs);
watchdog.unref();

// The loopback redirect URI: a port of our own, chosen at run time.
let callbackResolve;
const callbackPromise = new Promise((resolve) => {
  callbackResolve = resolve;
});
const callbackServer = http.createServer((req, res) => {
  const u = new URL(req.url, "http://127.0.0.1");
  if (u.pathname !== "/callback") {
    res.writeHead(404).end();
    return;
  }
  res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
  res.end('<!doctype html><title>Connected</title><p id="done">Connected to Mandate. You can close this page.</p>');
  callbackResolve(Object.fromEntries(u.searchParams));
});
await new Promise((resolve) => callbackServer.listen(0, "127.0.0.1", resolve));
const redirectUrl = `http://127.0.0.1:${callbackServer.address().port}/callback`;

// Every request the SDK makes, in order, so the test can see discovery.
const requests = [];
const tracingFetch = async (input, init) => {
  const res = await fetch(input, init);
  const u = new URL(input instanceof Request ? input.url : String(input));
  requests.push({ method: init?.method ?? (input instanceof Request ? input.method : "GET"), path: u.pathname, status: res.status });
  return res;
};

const provider = new MemoryOAuthProvider({ redirectUrl, clientName: "Mandate OAuth test", onAuthorize: (url) => emit({ event: "authorize", url: url.href }) });
const newClient = () => new Client({ name: "mandate-oauth-test", version: "1.0.0" }, { capabilities: {} });
const newTransport = () => new StreamableHTTPClientTransport(new URL(mcpURL), { authProvider: provider, fetch: tracingFetch });

// 1. Connecting without a token: 401, discovery, registration, and the
// authorization URL handed to "the browser".
let first = newClient();
try {
  await first.connect(newTransport());
  fatal("connected without authorizing");
} catch (err) {
  if (!(err instanceof UnauthorizedError)) {
    fatal("connecting without a token", err);
  }
}

// 2. The human signs in and approves; the browser comes back here.
const query = await callbackPromise;
emit({ event: "callback", query: { ...query, code: query.code ? "(present)" : undefined } });
if (query.error || !query.code) {
  fatal(`authorization failed: ${query.error} ${query.error_description ?? ""}`);
}
if (query.state !== provider.expectedState) {
  fatal("the state came back changed");
}

// 3. The code for tokens, then a session with them.
const authTransport = newTransport();
try {
  await authTransport.finishAuth(query.code);
} catch (err) {
  fatal("exchanging the code", err);
}
const claims = JSON.parse(Buffer.from(provider.savedTokens.access_token.split(".")[1], "base64url").toString());

const client = newClient();
await client.connect(newTransport());
const tools = (await client.listTools()).tools.map((t) => t.name).sort();
const call = await client.callTool({ name: "ticket.search", arguments: { query: "charged twice" } });

// 4. Revocation: the agent is disabled, so the next call is refused even
// though the access token has not expired.
const revoke = await fetch(provider.discovery.authorizationServerMetadata.revocation_endpoint, {
  method: "POST",
  headers: { "Content-Type": "application/x-www-form-urlencoded" },
  body: new URLSearchParams({
    token: provider.savedTokens.refresh_token,
    token_type_hint: "refresh_token",
    client_id: provider.client.client_id,
  }),
});
let afterRevoke;
try {
  afterRevoke = { result: await client.callTool({ name: "ticket.search", arguments: { query: "charged twice" } }) };
} catch (err) {
  afterRevoke = { error: { code: err.code, message: String(err.message ?? err) } };
}

emit({
  event: "done",
  clientId: provider.client.client_id,
  tokenType: provider.savedTokens.token_type,
  hasRefreshToken: Boolean(provider.savedTokens.refresh_token),
  claims: { sub: claims.sub, tenant: claims.tenant, act: claims.act },
  requests,
  tools,
  call,
  revokeStatus: revoke.status,
  afterRevoke,
});
await client.close().catch(() => {});
callbackServer.close();
process.exit(0);
