// Tasks-extension client peer: `@modelcontextprotocol/ext-tasks@0.2.2` over the TypeScript client
// `@modelcontextprotocol/client@2.4.0` pinned to 2026-07-28, through the proxy's /mcp.
//
// Usage: node tasks_client.mjs URL CMD [ARG...] [--auth TOKEN] [--timeout S]
//   create TOOL ARGS_JSON   call TOOL; print {"kind", "taskId"} as soon as the call returns, then exit
//                           (the client goes away; the task lives on)
//   settle TOOL ARGS_JSON   call TOOL and wait for its outcome; print {"kind", "taskId", "outcome"}
//   snapshot TASK_ID        tasks/get through a task controller; print the view
//   result TASK_ID          wait for the task's outcome (polling); print it
//   cancel TASK_ID          tasks/cancel, then one snapshot
// --auth sets `Authorization: Bearer TOKEN` on every request (the proxy's identity).
// ext-tasks has no transport of its own: the host dispatch below posts each request with the
// 2026-07-28 headers and reads a JSON or SSE answer.
// stdout: one JSON line: {"ok": true, ...} or {"ok": false, "error": {...}}. Exit 0 / 1; 124 on timeout.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createTaskSessionFromClient } from '@modelcontextprotocol/ext-tasks/client';

const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  if (i < 0) return dflt;
  const v = argv[i + 1];
  argv.splice(i, 2);
  return v;
};
const auth = opt('--auth', undefined);
const timeout = Number(opt('--timeout', process.env.PEER_TIMEOUT_S ?? '60'));
const [url, cmd, ...rest] = argv;
setTimeout(() => { console.error('tasks_client: timeout'); process.exit(124); }, timeout * 1000).unref();

const headers = auth ? { authorization: `Bearer ${auth}` } : {};
const clientInfo = { name: 'tasks-peer', version: '0.2.2' };
const capabilities = { elicitation: { form: {} } };
const client = new Client(clientInfo, { capabilities, versionNegotiation: { mode: { pin: '2026-07-28' } } });

let nextId = 1;
async function rawDispatch(request, options = {}) {
  const id = nextId++;
  const params = request.params ?? {};
  const h = {
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
    'mcp-protocol-version': params._meta?.['io.modelcontextprotocol/protocolVersion'] ?? '2026-07-28',
    'mcp-method': request.method,
    ...headers,
  };
  if (request.method === 'tools/call' && typeof params.name === 'string') h['mcp-name'] = params.name;
  for (const [k, v] of Object.entries(options.context?.headers ?? {})) h[k.toLowerCase()] = v;
  const res = await fetch(url, { method: 'POST', headers: h, body: JSON.stringify({ jsonrpc: '2.0', id, ...request }), signal: options.signal });
  const ct = res.headers.get('content-type') ?? '';
  let msg;
  if (ct.startsWith('text/event-stream')) {
    for (const block of (await res.text()).split(/\n\n/)) {
      const data = block.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim()).join('\n');
      if (data && JSON.parse(data).id === id) msg = JSON.parse(data);
    }
  } else {
    msg = JSON.parse(await res.text());
  }
  if (msg === undefined) throw new Error(`no response for ${request.method} (HTTP ${res.status})`);
  return msg.error ? { kind: 'error', error: msg.error } : { kind: 'result', result: msg.result };
}

const print = (o) => console.log(JSON.stringify(o));
const outcomeJson = (o) => ({
  status: o.status,
  result: o.status === 'completed' ? o.result : undefined,
  error: o.status === 'failed' ? { name: o.error?.name, message: o.error?.message, code: o.error?.code ?? o.error?.error?.code } : undefined,
});

try {
  // Auth on the probe too: the proxy's pool is per identity.
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }));
  const session = createTaskSessionFromClient(client, {
    endpointId: 'mcp-resume-proxy',
    rawDispatch,
    v2RequestFraming: { protocolVersion: '2026-07-28', clientInfo, clientCapabilities: capabilities },
    onInputRequest: async () => ({ action: 'accept', content: { answer: 'from tasks' } }),
  });
  if (cmd === 'create' || cmd === 'settle') {
    const ex = await session.callTool(rest[0], JSON.parse(rest[1] ?? '{}'));
    const taskId = ex.kind === 'task' ? ex.handle?.taskId : undefined;
    if (cmd === 'create') {
      print({ ok: true, kind: ex.kind, taskId });
      process.exit(0);
    }
    const st = await ex.settle();
    print({ ok: true, kind: ex.kind, taskId, outcome: outcomeJson(st.outcome), lastTask: st.lastTask?.raw });
  } else if (cmd === 'snapshot') {
    const v = await session.task(rest[0]).snapshot();
    print({ ok: true, status: v.status, statusMessage: v.statusMessage, ttl: v.retentionMs, raw: v.raw });
  } else if (cmd === 'result') {
    const o = await session.task(rest[0]).result();
    print({ ok: true, outcome: outcomeJson(o) });
  } else if (cmd === 'cancel') {
    await session.task(rest[0]).cancel();
    const v = await session.task(rest[0]).snapshot();
    print({ ok: true, status: v.status });
  } else {
    print({ ok: false, error: { message: `unknown command ${cmd}` } });
    process.exit(2);
  }
  process.exit(0);
} catch (e) {
  print({ ok: false, error: { name: e?.name, code: e?.code, message: String(e?.message ?? e), data: e?.data } });
  process.exit(1);
}
