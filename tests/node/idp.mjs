// Connects to a Mandate MCP bridge that trusts a production identity
// provider, the way an MCP host does: the official TypeScript SDK's OAuth
// client (an OAuthClientProvider on StreamableHTTPClientTransport) starts
// with no token, discovers the authorization server from the bridge's 401
// (RFC 9728, then the server's own metadata), registers there (RFC 7591),
// and hands the authorization URL to "the browser"; this script serves the
// loopback redirect URI (RFC 8252), exchanges the code, and then lists tools
// and calls ticket.search. tests/idp_test.go runs it against Ory Hydra and
// plays the browser itself.
//
// Unlike oauth.mjs, a refused tools/list or tools/call is reported, not
// fatal: the test also runs it for a host whose token names an agent the
// directory does not know.
//
// Usage:
//   MCP_URL=http://127.0.0.1:8085/mcp CLIENT_NAME="Support host" node idp.mjs
//
// Output (stdout): one JSON object per line, as things happen:
//   {"event":"authorize","url":…}       open this URL in a browser
//   {"event":"done", …}                  what the run saw (below)
// Failures print {"fatal":…} on stderr and exit 1. Tokens are never
// printed; the access token's claims are (they name no secret).

import http from "node:http";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";
import { MemoryOAuthProvider } from "./provider.mjs";

const mcpURL = process.env.MCP_URL;
const clientName = process.env.CLIENT_NAME || "Mandate IdP test";
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
  res.writeHead(200, { "Content-Type": "text/plain; charset=utf-8" });
  res.end("Connected to Mandate. You can close this page.");
  callbackResolve(Object.fromEntries(u.searchParams));
});
await new Promise((resolve) => callbackServer.listen(0, "127.0.0.1", resolve));
const redirectUrl = `http://127.0.0.1:${callbackServer.address().port}/callback`;

// Every request the SDK makes, in order, with its host, so the test can see
// which server answered discovery, registration and the token request.
const requests = [];
const tracingFetch = async (input, init) => {
  const res = await fetch(input, init);
  const u = new URL(input instanceof Request ? input.url : String(input));
  requests.push({ method: init?.method ?? (input instanceof Request ? input.method : "GET"), host: u.host, path: u.pathname, status: res.status });
  return res;
};

const provider = new MemoryOAuthProvider({ redirectUrl, clientName, onAuthorize: (url) => emit({ event: "authorize", url: url.href }) });
const newClient = () => new Client({ name: "mandate-idp-test", version: "1.0.0" }, { capabilities: {} });
const newTransport = () => new StreamableHTTPClientTransport(new URL(mcpURL), { authProvider: provider, fetch: tracingFetch });

// 1. Connecting without a token: 401, discovery, registration, and the
// authorization URL handed to "the browser".
const first = newClient();
try {
  await first.connect(newTransport());
  fatal("connected without authorizing");
} catch (err) {
  if (!(err instanceof UnauthorizedError)) {
    fatal("connecting without a token", err);
  }
}

// 2. The human signs in and consents; the browser comes back here.
const query = await callbackPromise;
if (query.error || !query.code) {
  fatal(`authorization failed: ${query.error} ${query.error_description ?? ""}`);
}
if (query.state !== provider.expectedState) {
  fatal("the state came back changed");
}

// 3. The code for tokens, then a session with them.
try {
  await newTransport().finishAuth(query.code);
} catch (err) {
  fatal("exchanging the code", err);
}
const claims = JSON.parse(Buffer.from(provider.savedTokens.access_token.split(".")[1], "base64url").toString());

const rpcError = (err) => ({ code: err.code, message: String(err.message ?? err), data: err.data });
const client = newClient();
let connectError;
try {
  await client.connect(newTransport());
} catch (err) {
  connectError = rpcError(err);
}
let tools, listError, call, callError;
if (!connectError) {
  try {
    tools = (await client.listTools()).tools.map((t) => t.name).sort();
  } catch (err) {
    listError = rpcError(err);
  }
  try {
    call = await client.callTool({ name: "ticket.search", arguments: { query: "charged twice" } });
  } catch (err) {
    callError = rpcError(err);
  }
}

emit({
  event: "done",
  clientId: provider.client.client_id,
  tokenType: provider.savedTokens.token_type,
  authorizationServer: provider.discovery?.authorizationServerUrl,
  registrationEndpoint: provider.discovery?.authorizationServerMetadata?.registration_endpoint,
  claims,
  requests,
  connectError,
  tools,
  listError,
  call,
  callError,
});
await client.close().catch(() => {});
callbackServer.close();
process.exit(0);
