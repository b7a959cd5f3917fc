#!/usr/bin/env node
// An identified MCP client test peer: the UNMODIFIED TypeScript SDK (@modelcontextprotocol/sdk@1.32.2)
// `Client` over either transport, sending extra request headers (e.g. `Authorization`) on every
// request through the transports' documented `requestInit` option (and, for the legacy transport,
// on the EventSource's own requests, reconnections included, through `eventSourceInit.fetch`).
//
// What: connect -> one long tools/call TOOL with ARGS and an `onprogress` handler (the SDK sets
//   _meta.progressToken) -> waits for --expect-logs N log notifications -> (streamable) DELETE -> close.
//   When the test cuts the connection carrying the call, the SDK reconnects by itself:
//   streamable: GET + Last-Event-ID (its resumption token); legacy (`--transport sse`): the
//   `eventsource` package reconnects to the SSE URL with Last-Event-ID.
//
// Run (after scripts/install-peers):
//   node tests/peers/ts_auth_client.mjs URL --transport streamable|sse --tool NAME --args JSON
//        [--header "Name: value"]... [--expect-logs N] [--timeout S]
//
// stdout: JSON lines only.
//   {"event":"connected","session_id":...}
//   {"event":"progress","progress":P}          (as the SDK delivers it)
//   last, on success: {"result": TEXT, "progress": [P...], "logs": [...], "session_id": ...,
//                      "messages": [every message the transport delivered after connect, in order,
//                      as {"method":..,"progress"?:..} or {"id":..,"response":true}], "errors": [...]}
// stderr: diagnostics. Exit: 0 ok; 1 failure; 2 usage / non-loopback URL; 124 overall timeout.

import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import fs from 'node:fs';

const PROG = 'ts_auth_client';
const here = path.dirname(fileURLToPath(import.meta.url));
const sdkRoot = path.join(here, 'node', 'node_modules', '@modelcontextprotocol', 'sdk', 'dist', 'esm');

function die(code, msg) {
  process.stderr.write(`${PROG}: ${msg}\n`);
  process.exit(code);
}

function parseArgs(argv) {
  const out = { url: undefined, transport: 'streamable', tool: undefined, args: '{}', headers: {},
    expectLogs: 0, timeout: Number(process.env.PEER_TIMEOUT_S ?? '60') };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) die(2, `${a} needs a value`);
      return argv[++i];
    };
    if (a === '--tool') out.tool = next();
    else if (a === '--args') out.args = next();
    else if (a === '--transport') out.transport = next();
    else if (a === '--header') {
      const h = next();
      const at = h.indexOf(':');
      if (at < 1) die(2, `--header wants "Name: value", got ${h}`);
      out.headers[h.slice(0, at).trim()] = h.slice(at + 1).trim();
    } else if (a === '--expect-logs') out.expectLogs = Number(next());
    else if (a === '--timeout') out.timeout = Number(next());
    else if (a.startsWith('--')) die(2, `unknown option ${a}`);
    else if (out.url === undefined) out.url = a;
    else die(2, `unexpected argument ${a}`);
  }
  if (!out.url || !out.tool || !['streamable', 'sse'].includes(out.transport)) {
    die(2, 'usage: ts_auth_client.mjs URL --transport streamable|sse --tool NAME --args JSON [--header "K: V"]... [--expect-logs N] [--timeout S]');
  }
  const host = new URL(out.url).hostname;
  if (!['127.0.0.1', 'localhost', '[::1]'].includes(host)) die(2, `refusing non-loopback URL ${out.url}`);
  return out;
}

const opts = parseArgs(process.argv.slice(2));
if (!fs.existsSync(path.join(sdkRoot, 'client', 'index.js'))) {
  die(1, `${sdkRoot} missing; run scripts/install-peers`);
}
const load = p => import(pathToFileURL(path.join(sdkRoot, p)).href);
const { Client } = await load('client/index.js');
const { StreamableHTTPClientTransport } = await load('client/streamableHttp.js');
const { SSEClientTransport } = await load('client/sse.js');
const { CallToolResultSchema, LoggingMessageNotificationSchema } = await load('types.js');

const emit = obj => process.stdout.write(JSON.stringify(obj) + '\n');
const textOf = res => (res.content ?? []).filter(c => c.type === 'text').map(c => c.text).join('\n');

const timer = setTimeout(() => {
  process.stderr.write(`${PROG}: overall timeout of ${opts.timeout} s expired\n`);
  process.exit(124);
}, opts.timeout * 1000);

function transportFor() {
  const url = new URL(opts.url);
  const requestInit = { headers: { ...opts.headers } };
  if (opts.transport === 'streamable') return new StreamableHTTPClientTransport(url, { requestInit });
  // The EventSource's requests (the first GET and every reconnection) carry the headers too.
  const esFetch = (u, init) => {
    const headers = new Headers(init?.headers ?? {});
    for (const [k, v] of Object.entries(opts.headers)) headers.set(k, v);
    return fetch(u, { ...init, headers });
  };
  return new SSEClientTransport(url, { requestInit, eventSourceInit: { fetch: esFetch } });
}

function sessionOf(transport) {
  if (opts.transport === 'streamable') return transport.sessionId;
  // The legacy transport keeps the endpoint URL the server announced (".../messages?session_id=").
  return transport._endpoint?.searchParams?.get('session_id') ?? null;
}

async function main() {
  const errors = [];
  const logs = [];
  const progress = [];
  const messages = [];
  const transport = transportFor();
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
  const inner = transport.onmessage;
  transport.onmessage = (msg, extra) => {
    if ('method' in msg) messages.push({ method: msg.method, ...(msg.method === 'notifications/progress' ? { progress: msg.params?.progress } : {}) });
    else messages.push({ id: msg.id, response: true, error: 'error' in msg });
    inner?.(msg, extra);
  };
  const sessionId = sessionOf(transport);
  emit({ event: 'connected', session_id: sessionId });
  const res = await client.request(
    { method: 'tools/call', params: { name: opts.tool, arguments: JSON.parse(opts.args) } },
    CallToolResultSchema,
    {
      timeout: opts.timeout * 1000,
      onprogress: p => {
        progress.push(p.progress);
        emit({ event: 'progress', progress: p.progress });
      },
    },
  );
  if (res.isError) throw new Error(`${opts.tool} returned isError: ${textOf(res)}`);
  while (logs.length < opts.expectLogs) await new Promise(r => setTimeout(r, 50));
  if (opts.transport === 'streamable') await transport.terminateSession();
  await client.close();
  emit({ result: textOf(res), progress, logs, session_id: sessionId, messages, errors });
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
