// Drives Mandate's MCP endpoint with the official TypeScript SDK client
// (@modelcontextprotocol/sdk) and prints what it saw as one JSON document.
// tests/node_test.go runs it against `mandate dev`.
//
// Usage:
//   MCP_URL=http://127.0.0.1:8080/mcp MCP_TOKEN=... node client.mjs '<steps>'
//
// <steps> is a JSON array run in order on one session:
//   {"op":"list"}                                  tools/list
//   {"op":"call","name":"ticket.search","arguments":{...},"meta":{...}}
//   {"op":"read","uri":"mandate://manifest"}       resources/read
//
// MCP_ELICIT is how the client answers elicitation/create: "accept"
// (every boolean field set to true), "decline" or "cancel". Unset or
// "none", the client declares no elicitation capability at all.
// MCP_TIMEOUT_MS bounds each request and the whole run (default 20000).
//
// Output (stdout): {"server":…, "steps":[…], "elicitations":[…]}. A step
// that failed with a JSON-RPC error has {"ok":false,"error":{code,message}};
// the run still exits 0. Transport or timeout failures print
// {"fatal":…} on stderr and exit 1. The token is never printed.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema, McpError } from "@modelcontextprotocol/sdk/types.js";

const url = process.env.MCP_URL;
const token = process.env.MCP_TOKEN;
const elicit = process.env.MCP_ELICIT || "none";
const timeoutMs = Number(process.env.MCP_TIMEOUT_MS || 20000);

function fatal(message, err) {
  const out = { fatal: message };
  if (err) {
    out.error = { name: err.name, message: String(err.message ?? err), code: err.code };
  }
  process.stderr.write(JSON.stringify(out) + "\n");
  process.exit(1);
}

if (!url || !token) {
  fatal("MCP_URL and MCP_TOKEN must be set");
}
if (!["none", "accept", "decline", "cancel"].includes(elicit)) {
  fatal(`MCP_ELICIT must be none, accept, decline or cancel, not ${JSON.stringify(elicit)}`);
}
let steps;
try {
  steps = JSON.parse(process.argv[2] ?? "[]");
  if (!Array.isArray(steps)) throw new Error("not an array");
} catch (err) {
  fatal("the first argument must be a JSON array of steps", err);
}

// The whole run has a deadline, so CI never hangs on a stuck server.
const watchdog = setTimeout(() => fatal(`timed out after ${timeoutMs} ms`), timeoutMs);
watchdog.unref();

const capabilities = elicit === "none" ? {} : { elicitation: { form: {} } };
const client = new Client({ name: "mandate-node-test", version: "1.0.0" }, { capabilities });

const elicitations = [];
if (elicit !== "none") {
  client.setRequestHandler(ElicitRequestSchema, async (request) => {
    const params = request.params;
    elicitations.push({
      mode: params.mode ?? "form",
      message: params.message,
      requestedSchema: params.requestedSchema,
      meta: params._meta,
    });
    if (elicit !== "accept") {
      return { action: elicit };
    }
    // Accept: answer every field, booleans with yes.
    const content = {};
    for (const [name, prop] of Object.entries(params.requestedSchema?.properties ?? {})) {
      if (prop.type === "boolean") content[name] = true;
      else if (prop.default !== undefined) content[name] = prop.default;
      else if (Array.isArray(prop.enum) && prop.enum.length > 0) content[name] = prop.enum[0];
      else if (prop.type === "number" || prop.type === "integer") content[name] = prop.minimum ?? 0;
      else content[name] = "yes";
    }
    return { action: "accept", content };
  });
}

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
  // No retries: a failure should show, not be papered over.
  reconnectionOptions: { maxRetries: 0, initialReconnectionDelay: 1000, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1 },
});

function rpcError(err) {
  if (err instanceof McpError) {
    return { code: err.code, message: err.message, data: err.data };
  }
  return { code: null, message: String(err?.message ?? err) };
}

try {
  await client.connect(transport, { timeout: timeoutMs });
} catch (err) {
  fatal(`connecting to ${url}`, err);
}

const output = {
  server: {
    info: client.getServerVersion(),
    capabilities: client.getServerCapabilities(),
    protocolVersion: transport.protocolVersion,
    sessionId: transport.sessionId,
  },
  steps: [],
  elicitations,
};

const opts = { timeout: timeoutMs };
for (const step of steps) {
  const record = { op: step.op };
  try {
    switch (step.op) {
      case "list": {
        const res = await client.listTools(undefined, opts);
        record.tools = res.tools;
        break;
      }
      case "call": {
        record.name = step.name;
        const params = { name: step.name, arguments: step.arguments ?? {} };
        if (step.meta) params._meta = step.meta;
        record.result = await client.callTool(params, undefined, opts);
        break;
      }
      case "read": {
        record.uri = step.uri;
        record.result = await client.readResource({ uri: step.uri }, opts);
        break;
      }
      default:
        fatal(`unknown step ${JSON.stringify(step)}`);
    }
    record.ok = true;
  } catch (err) {
    if (!(err instanceof McpError)) {
      fatal(`step ${JSON.stringify(step.op)} failed outside JSON-RPC`, err);
    }
    record.ok = false;
    record.error = rpcError(err);
  }
  output.steps.push(record);
}

try {
  await transport.terminateSession();
} catch {
  // The session ends with the process anyway.
}
await client.close();
process.stdout.write(JSON.stringify(output) + "\n", () => process.exit(0));
