#!/usr/bin/env node
// Streamable HTTP client test peer: the UNMODIFIED TypeScript SDK (@modelcontextprotocol/sdk@1.32.2)
// `Client` over `StreamableHTTPClientTransport`, default reconnection options.
//
// What: connect (initialize + notifications/initialized + standalone GET) -> tools/list ->
//   one long tools/call TOOL with ARGS and an `onprogress` handler (the SDK then sets
//   _meta.progressToken = request id) and an `onresumptiontoken` handler -> optionally
//   (--echo JSON) a second tools/call `echo` -> DELETE (transport.terminateSession) -> close.
//   When the connection carrying the long call is cut (the test severs it), the SDK resumes
//   by itself: GET + Last-Event-ID = the last resumption token it saw.
//
// Run (after scripts/install-peers):
//   node tests/peers/ts_streamable_client.mjs URL --tool NAME --args JSON [--echo JSON]
//        [--expect-logs N] [--timeout S]
//
// stdout: JSON lines only.
//   while running:  {"event":"connected","session_id":...,"protocol_version":...}
//                   {"event":"progress","progress":P,"total":T,"message":M}   (as the SDK delivers it)
//                   {"event":"token","token":ID}                               (onresumptiontoken)
//   on success, last: {"result": TEXT, "tools": [...], "progress": [[P,T,M],...], "logs": [...],
//                      "tokens": [...], "messages": [...every message the transport delivered, in order,
//                      as {"method":..} or {"id":..,"response":true}...], "call_id": ID,
//                      "errors": [...transport/client onerror texts...], "session_id":...,
//                      "protocol_version":..., ["echo": TEXT], "deleted": true}
// stderr: diagnostics. Exit: 0 ok; 1 failure; 2 usage / non-loopback URL; 124 overall timeout
//   (--timeout, env PEER_TIMEOUT_S, default 60 s).

import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import fs from 'node:fs';

const PROG = 'ts_streamable_client';
const here = path.dirname(fileURLToPath(import.meta.url));
const sdkRoot = path.join(here, 'node', 'node_modules', '@modelcontextprotocol', 'sdk', 'dist', 'esm');

function die(code, msg) {
  process.stderr.write(`${PROG}: ${msg}\n`);
  process.exit(code);
}

function parseArgs(argv) {
  const out = { url: undefined, tool: undefined, args: '{}', echo: undefined, expectLogs: 0,
    timeout: Number(process.env.PEER_TIMEOUT_S ?? '60') };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) die(2, `${a} needs a value`);
      return argv[++i];
    };
    if (a === '--tool') out.tool = next();
    else if (a === '--args') out.args = next();
    else if (a === '--echo') out.echo = next();
    else if (a === '--expect-logs') out.expectLogs = Number(next());
    else if (a === '--timeout') out.timeout = Number(next());
    else if (a.startsWith('--')) die(2, `unknown option ${a}`);
    else if (out.url === undefined) out.url = a;
    else die(2, `unexpected argument ${a}`);
  }
  if (!out.url || !out.tool) die(2, 'usage: ts_streamable_client.mjs URL --tool NAME --args JSON [--echo JSON] [--expect-logs N] [--timeout S]');
  const host = new URL(out.url).hostname;
  if (!['127.0.0.1', 'localhost', '[::1]'].includes(host)) die(2, `refusing non-loopback URL ${out.url}`);
  return out;
}

const opts = parseArgs(process.argv.slice(2));
if (!fs.existsSync(path.join(sdkRoot, 'client', 'index.js'))) {
  die(1, `${sdkRoot} missing; run scripts/install-peers`);
}
const { Client } = await import(pathToFileURL(path.join(sdkRoot, 'client', 'index.js')).href);
const { StreamableHTTPClientTransport } = await import(pathToFileURL(path.join(sdkRoot, 'client', 'streamableHttp.js')).href);
const { CallToolResultSchema, LoggingMessageNotificationSchema } = await import(pathToFileURL(path.join(sdkRoot, 'types.js')).href);

const emit = obj => process.stdout.write(JSON.stringify(obj) + '\n');
const textOf = res => {
  const parts = (res.content ?? []).filter(c => c.type === 'text').map(c => c.text);
  if (!parts.length) throw new Error(`tool result has no text content: ${JSON.stringify(res)}`);
  return parts.join('\n');
};

const timer = setTimeout(() => {
  process.stderr.write(`${PROG}: overall timeout of ${opts.timeout} s expired\n`);
  process.exit(124);
}, opts.timeout * 1000);

async function main() {
  const errors = [];
  const logs = [];
  const progress = [];
  const tokens = [];
  const messages = [];
  const transport = new StreamableHTTPClientTransport(new URL(opts.url));
  const client = new Client({ name: PROG, version: '1.0.0' }, { capabilities: {} });
  client.onerror = e => {
    const t = e instanceof Error ? e.message : String(e);
    errors.push(t);
    process.stderr.write(`${PROG}: onerror: ${t}\n`);
  };
  client.setNotificationHandler(LoggingMessageNotificationSchema, n => {
    logs.push(n.params.data);
  });
  await client.connect(transport);
  // Record every message the transport hands the client, in arrival order (after connect, so
  // the Client's own handler is installed and is called through).
  const inner = transport.onmessage;
  transport.onmessage = (msg, extra) => {
    if ('method' in msg) messages.push({ method: msg.method, ...(msg.method === 'notifications/progress' ? { progress: msg.params?.progress } : {}) });
    else messages.push({ id: msg.id, response: true, error: 'error' in msg });
    inner?.(msg, extra);
  };
  const sessionId = transport.sessionId;
  const protocolVersion = transport.protocolVersion;
  emit({ event: 'connected', session_id: sessionId, protocol_version: protocolVersion });

  const tools = await client.listTools();
  const args = JSON.parse(opts.args);
  let callId;
  const origSend = transport.send.bind(transport);
  transport.send = (msg, o) => {
    if (msg.method === 'tools/call' && callId === undefined) callId = msg.id;
    return origSend(msg, o);
  };
  const res = await client.request(
    { method: 'tools/call', params: { name: opts.tool, arguments: args } },
    CallToolResultSchema,
    {
      timeout: opts.timeout * 1000,
      onprogress: p => {
        progress.push([p.progress, p.total ?? null, p.message ?? null]);
        emit({ event: 'progress', progress: p.progress, total: p.total ?? null, message: p.message ?? null });
      },
      onresumptiontoken: t => {
        tokens.push(t);
        emit({ event: 'token', token: t });
      },
    },
  );
  if (res.isError) throw new Error(`${opts.tool} returned isError: ${textOf(res)}`);
  const out = {
    result: textOf(res),
    tools: tools.tools.map(t => t.name),
    progress,
    tokens,
    call_id: callId,
    session_id: sessionId,
    protocol_version: protocolVersion,
  };
  if (opts.echo !== undefined) {
    const e = await client.callTool({ name: 'echo', arguments: JSON.parse(opts.echo) });
    if (e.isError) throw new Error(`echo returned isError: ${textOf(e)}`);
    out.echo = textOf(e);
  }
  // Logs travel on the standalone stream, independently of the call's stream: wait for them.
  while (logs.length < opts.expectLogs) await new Promise(r => setTimeout(r, 50));
  await transport.terminateSession();
  out.deleted = true;
  await client.close();
  out.logs = logs;
  out.messages = messages;
  out.errors = errors;
  emit(out);
}

main().then(
  () => {
    clearTimeout(timer);
    process.exit(0);
  },
  e => {
    process.stderr.write(`${PROG}: failed: ${e?.stack ?? e}\n`);
    process.exit(1);
  },
);
