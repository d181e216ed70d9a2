// Calls one tool as an MCP task (2025-11-25, experimental) with the
// official TypeScript SDK client, which declares task support, and prints
// what happens as it happens, one JSON document per line, so that
// tests/node_tasks_test.go can approve the call while the client waits.
//
// Usage:
//   MCP_URL=http://127.0.0.1:8080/mcp MCP_TOKEN=... MCP_TASK_MODE=stream \
//     node tasks.mjs '{"name":"ticket.refund","arguments":{...}}'
//
// MCP_TASK_MODE:
//   stream  client.experimental.tasks.callToolStream, which creates the task
//           (the tool is listed with execution.taskSupport, so the client
//           adds `task` itself), follows it with tasks/get at the server's
//           pollInterval and fetches the result with tasks/result;
//   result  the same call, then tasks/result at once, which blocks until
//           the task ends: no polling at all.
// MCP_ELICIT: "accept" or "decline" also declares form elicitation and
// answers every confirmation form so (the form of a task comes while the
// client waits on tasks/result); unset or "none", no elicitation.
// MCP_TIMEOUT_MS bounds each request and the whole run (default 60000).
//
// Lines (stdout):
//   {"type":"server","capabilities":…,"protocolVersion":…,"taskTools":[…]}
//   {"type":"taskCreated","task":…} / {"type":"taskStatus","task":…}
//   {"type":"elicitation","mode":…,"message":…,"meta":…} (MCP_ELICIT)
//   {"type":"result","result":…} or {"type":"error","error":…}
//   {"type":"done","sent":{"<method>":count,…}}
// Transport failures print {"fatal":…} on stderr and exit 1. The token is
// never printed.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema, ElicitRequestSchema, McpError } from "@modelcontextprotocol/sdk/types.js";

const url = process.env.MCP_URL;
const token = process.env.MCP_TOKEN;
const mode = process.env.MCP_TASK_MODE || "stream";
const elicit = process.env.MCP_ELICIT || "none";
const timeoutMs = Number(process.env.MCP_TIMEOUT_MS || 60000);

function fatal(message, err) {
  const out = { fatal: message };
  if (err) {
    out.error = { name: err.name, message: String(err.message ?? err), code: err.code };
  }
  process.stderr.write(JSON.stringify(out) + "\n");
  process.exit(1);
}

function line(doc) {
  process.stdout.write(JSON.stringify(doc) + "\n");
}

if (!url || !token) {
  fatal("MCP_URL and MCP_TOKEN must be set");
}
if (!["none", "accept", "decline"].includes(elicit)) {
  fatal(`MCP_ELICIT must be none, accept or decline, not ${JSON.stringify(elicit)}`);
}
if (!["stream", "result"].includes(mode)) {
  fatal(`MCP_TASK_MODE must be stream or result, not ${JSON.stringify(mode)}`);
}
let call;
try {
  call = JSON.parse(process.argv[2] ?? "");
  if (typeof call?.name !== "string") throw new Error("no name");
} catch (err) {
  fatal("the first argument must be {\"name\":…,\"arguments\":…}", err);
}

const watchdog = setTimeout(() => fatal(`timed out after ${timeoutMs} ms`), timeoutMs);
watchdog.unref();

// The client declares task support (2025-11-25 capabilities.tasks).
const capabilities = { tasks: { list: {}, cancel: {} } };
if (elicit !== "none") capabilities.elicitation = { form: {} };
const client = new Client({ name: "mandate-node-tasks", version: "1.0.0" }, { capabilities });
if (elicit !== "none") {
  client.setRequestHandler(ElicitRequestSchema, async (request) => {
    const params = request.params;
    line({ type: "elicitation", mode: params.mode ?? "form", message: params.message, meta: params._meta });
    return elicit === "accept" ? { action: "accept", content: {} } : { action: "decline" };
  });
}
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
  reconnectionOptions: { maxRetries: 0, initialReconnectionDelay: 1000, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1 },
});

// Count what the client sends, by method: the test holds it to one
// tools/call.
const sent = {};
const send = transport.send.bind(transport);
transport.send = (message, options) => {
  if (message.method) sent[message.method] = (sent[message.method] ?? 0) + 1;
  return send(message, options);
};

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

const opts = { timeout: timeoutMs };
const { tools } = await client.listTools(undefined, opts);
line({
  type: "server",
  capabilities: client.getServerCapabilities(),
  protocolVersion: transport.protocolVersion,
  taskTools: tools.filter((t) => t.execution?.taskSupport === "optional").map((t) => t.name),
});

const stream = client.experimental.tasks.callToolStream(
  { name: call.name, arguments: call.arguments ?? {} },
  CallToolResultSchema,
  opts,
);
for await (const message of stream) {
  if (message.type === "error") {
    line({ type: "error", error: rpcError(message.error) });
    break;
  }
  line(message);
  if (message.type === "taskCreated" && mode === "result") {
    // Straight to tasks/result, which blocks until the task ends.
    try {
      const result = await client.experimental.tasks.getTaskResult(message.task.taskId, CallToolResultSchema, opts);
      line({ type: "result", result });
    } catch (err) {
      line({ type: "error", error: rpcError(err) });
    }
    break;
  }
  if (message.type === "result") break;
}

line({ type: "done", sent });
try {
  await transport.terminateSession();
} catch {
  // The session ends with the process anyway.
}
await client.close();
process.exit(0);
