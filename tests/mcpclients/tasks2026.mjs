// Calls one tool with the 2026-07-28 TypeScript client
// (@modelcontextprotocol/client) through the official Tasks extension
// requester (@modelcontextprotocol/ext-tasks), which declares
// io.modelcontextprotocol/tasks, and prints what happens as it happens, one
// JSON document per line, so that tests/node_tasks_test.go can approve the
// call while the client waits.
//
// Usage:
//   MCP_URL=http://127.0.0.1:8080/mcp MCP_TOKEN=... \
//     node tasks2026.mjs '{"name":"ticket.refund","arguments":{...}}'
//
// Lines (stdout):
//   {"type":"server","era":…}
//   {"type":"task","task":{taskId,status,statusMessage,…}}   as it changes
//   {"type":"outcome","outcome":{status,result|error}}
//   {"type":"done","sent":{"<method>":count,…}}
// Failures print {"fatal":…} on stderr and exit 1. The token is never
// printed.

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { createTaskSessionFromClient } from "@modelcontextprotocol/ext-tasks/client";

const url = process.env.MCP_URL;
const token = process.env.MCP_TOKEN;
const timeoutMs = Number(process.env.MCP_TIMEOUT_MS || 60000);
const protocolVersion = "2026-07-28";

function fatal(message, err) {
  const out = { fatal: message };
  if (err) out.error = { name: err.name, message: String(err.message ?? err), code: err.code, cause: String(err.cause?.message ?? err.cause ?? ""), stack: String(err.cause?.stack ?? "").slice(0, 1500) };
  process.stderr.write(JSON.stringify(out) + "\n");
  process.exit(1);
}
const line = (doc) => process.stdout.write(JSON.stringify(doc) + "\n");

if (!url || !token) fatal("MCP_URL and MCP_TOKEN must be set");
let call;
try {
  call = JSON.parse(process.argv[2] ?? "");
  if (typeof call?.name !== "string") throw new Error("no name");
} catch (err) {
  fatal('the first argument must be {"name":…,"arguments":…}', err);
}
const watchdog = setTimeout(() => fatal(`timed out after ${timeoutMs} ms`), timeoutMs);
watchdog.unref();

const clientInfo = { name: "mandate-node-tasks-2026", version: "1.0.0" };
const clientCapabilities = { extensions: { "io.modelcontextprotocol/tasks": {} } };
const client = new Client(clientInfo, {
  capabilities: clientCapabilities,
  versionNegotiation: { mode: { pin: protocolVersion } },
});
const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: { token: async () => token } });
try {
  await client.connect(transport);
} catch (err) {
  fatal(`connecting to ${url}`, err);
}
line({ type: "server", era: client.getProtocolEra?.() });

// The extension's V2 requests (tasks/get, and tools/call answered with a
// task) go out as plain 2026-07-28 HTTP requests: each carries the
// protocol version, the client's capabilities and the routing headers.
const sent = {};
let nextId = 1;
async function rawDispatch(request) {
  // The requester hands over method and params; the host frames them.
  request = { jsonrpc: "2.0", id: `task-${nextId++}`, ...request };
  sent[request.method] = (sent[request.method] ?? 0) + 1;
  const headers = {
    Authorization: `Bearer ${token}`,
    "Content-Type": "application/json",
    Accept: "application/json, text/event-stream",
    "Mcp-Protocol-Version": protocolVersion,
    "Mcp-Method": request.method,
  };
  if (request.method === "tools/call" && request.params?.name) headers["Mcp-Name"] = request.params.name;
  const res = await fetch(url, { method: "POST", headers, body: JSON.stringify(request) });
  const text = await res.text();
  if ((res.headers.get("content-type") ?? "").startsWith("text/event-stream")) {
    for (const l of text.split("\n")) {
      if (l.startsWith("data:")) {
        const msg = JSON.parse(l.slice(5));
        if (msg.id !== undefined) return msg;
      }
    }
    throw new Error(`no response in the stream (${res.status})`);
  }
  return JSON.parse(text);
}

const session = createTaskSessionFromClient(client, {
  endpointId: "mandate-test",
  rawDispatch,
  v2RequestFraming: { protocolVersion, clientInfo, clientCapabilities },
});
try {
  const execution = await session.callTool(call.name, call.arguments ?? {});
  const { outcome } = await execution.settle({
    onEvent: (event) => {
      if (event.type === "task") {
        const t = event.task;
        line({ type: "task", task: { taskId: t.taskId, status: t.status, statusMessage: t.statusMessage } });
      }
    },
  });
  const out = { status: outcome.status };
  if (outcome.status === "completed") out.result = outcome.result;
  if (outcome.status === "failed") out.error = String(outcome.error?.message ?? outcome.error);
  line({ type: "outcome", outcome: out });
} catch (err) {
  fatal("calling the tool", err);
} finally {
  await session.close().catch(() => {});
}
line({ type: "done", sent });
await client.close().catch(() => {});
process.exit(0);
