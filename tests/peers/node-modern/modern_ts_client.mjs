// MCP 2026-07-28 client peer: the TypeScript SDK `@modelcontextprotocol/client@2.4.0` (pinned to
// 2026-07-28, or `--mode auto`), through the proxy's /mcp, in front of a legacy upstream.
//
// Usage: node modern_ts_client.mjs URL KIND [--mode pin|auto] [--timeout S]
//   KIND: fastmcp (fastmcp_legacy_server.py --modern-tools) | everything (server-everything sse)
// Runs: connect, discover, list, call, progress, (fastmcp) logLevel-gated logs, an MRTR round trip
// (fastmcp: elicitation via `ask`; everything: sampling via `trigger-sampling-request`), and a
// listen that must receive notifications/tools/list_changed (fastmcp: tool `change`; everything:
// a second client with other capabilities makes the proxy open another upstream session, where
// server-everything registers its conditional tools).
// stdout: one JSON line {"step": ..., "ok": true|false, "detail": ...} per step, then
// {"done": true, "failed": [steps]}. Exit 0 when every step passed, 1 otherwise, 124 on timeout.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const args = process.argv.slice(2);
const [url, kind] = args;
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const mode = opt('--mode', 'pin');
const timeout = Number(opt('--timeout', process.env.PEER_TIMEOUT_S ?? '60'));
if (!url || !['fastmcp', 'everything'].includes(kind)) {
  console.error('usage: node modern_ts_client.mjs URL fastmcp|everything [--mode pin|auto]');
  process.exit(2);
}
setTimeout(() => { console.error('modern_ts_client: timeout'); process.exit(124); }, timeout * 1000).unref();

const failed = [];
const out = (step, ok, detail) => {
  if (!ok) failed.push(step);
  console.log(JSON.stringify({ step, ok, detail }));
};
const text = (r) => (r?.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('');
const versionNegotiation = mode === 'pin' ? { mode: { pin: '2026-07-28' } } : { mode: 'auto' };

function client(capabilities) {
  const c = new Client({ name: 'modern-ts-peer', version: '2.4.0' }, { capabilities, versionNegotiation });
  if (capabilities.elicitation) {
    c.setRequestHandler('elicitation/create', async () => ({ action: 'accept', content: { answer: 'forty-two' } }));
  }
  if (capabilities.sampling) {
    c.setRequestHandler('sampling/createMessage', async (req) => ({
      role: 'assistant', content: { type: 'text', text: `echo of ${req.params.messages?.length ?? 0} message(s)` },
      model: 'peer-model', stopReason: 'endTurn',
    }));
  }
  if (capabilities.roots) {
    c.setRequestHandler('roots/list', async () => ({ roots: [{ uri: 'file:///tmp', name: 'tmp' }] }));
  }
  return c;
}

const main = client({ elicitation: { form: {} }, sampling: {} });
const notes = [];
main.setNotificationHandler('notifications/message', (n) => notes.push(n.params));
const changes = [];
main.setNotificationHandler('notifications/tools/list_changed', (n) => changes.push(n.params ?? {}));

const step = async (name, fn) => {
  try {
    const d = await fn();
    out(name, true, d);
  } catch (e) {
    out(name, false, { name: e?.name, code: e?.code, message: String(e?.message ?? e), data: e?.data });
  }
};
const check = (cond, what) => { if (!cond) throw new Error(`check failed: ${what}`); };

await step('connect', async () => {
  await main.connect(new StreamableHTTPClientTransport(new URL(url)));
  const era = main.getProtocolEra?.();
  check(era === 'modern', `era ${era}`);
  return { era, server: main.getServerVersion() };
});
if (failed.length) {
  console.log(JSON.stringify({ done: true, failed }));
  process.exit(1);
}
await step('discover', async () => {
  const caps = main.getServerCapabilities();
  check(JSON.stringify(caps?.extensions?.['io.modelcontextprotocol/tasks']) === '{}', 'tasks extension {}');
  return caps;
});
await step('list', async () => {
  const names = (await main.listTools()).tools.map((t) => t.name);
  check(names.includes('echo'), 'echo listed');
  return names;
});
await step('call', async () => {
  const r = kind === 'fastmcp'
    ? await main.callTool({ name: 'echo', arguments: { text: 'hi modern' } })
    : await main.callTool({ name: 'echo', arguments: { message: 'hi modern' } });
  check(text(r).includes('hi modern'), `echo result ${text(r)}`);
  return text(r);
});
await step('progress', async () => {
  const prog = [];
  const r = kind === 'fastmcp'
    ? await main.callTool({ name: 'tick', arguments: { n: 3, interval_ms: 50 } }, { onprogress: (p) => prog.push(p.progress) })
    : await main.callTool({ name: 'trigger-long-running-operation', arguments: { duration: 1, steps: 3 } },
      { onprogress: (p) => prog.push(p.progress) });
  check(JSON.stringify(prog) === '[1,2,3]', `progress ${JSON.stringify(prog)}`);
  return { result: text(r), progress: prog };
});
if (kind === 'fastmcp') {
  await step('loglevel', async () => {
    notes.length = 0;
    await main.callTool({ name: 'tick', arguments: { n: 2, interval_ms: 20 } });
    const without = notes.length;
    await main.callTool({ name: 'tick', arguments: { n: 2, interval_ms: 20 }, _meta: { 'io.modelcontextprotocol/logLevel': 'info' } });
    const withLevel = notes.map((n) => n.data);
    check(without === 0, `no logs without logLevel (${without})`);
    check(withLevel.length === 2, `2 logs with logLevel (${JSON.stringify(withLevel)})`);
    return { without, withLevel };
  });
}
await step('mrtr', async () => {
  const r = kind === 'fastmcp'
    ? await main.callTool({ name: 'ask', arguments: { question: 'the answer?' } })
    : await main.callTool({ name: 'trigger-sampling-request', arguments: { prompt: 'hello', maxTokens: 20 } });
  const t = text(r);
  check(kind === 'fastmcp' ? t === 'answer: forty-two' : t.includes('echo of 1 message'), `mrtr result ${t}`);
  return t;
});
await step('listen', async () => {
  changes.length = 0;
  const sub = await main.listen({ toolsListChanged: true });
  check(sub.honoredFilter?.toolsListChanged === true, `honoured ${JSON.stringify(sub.honoredFilter)}`);
  if (kind === 'fastmcp') {
    await main.callTool({ name: 'change', arguments: {} });
  } else {
    const other = client({ roots: {} });
    await other.connect(new StreamableHTTPClientTransport(new URL(url)));
    await other.callTool({ name: 'echo', arguments: { message: 'from another client' } });
    await other.close();
  }
  const t0 = Date.now();
  while (changes.length === 0 && Date.now() - t0 < 10000) await new Promise((r) => setTimeout(r, 50));
  await sub.close();
  check(changes.length >= 1, 'a tools/list_changed on the listen stream');
  return { changes: changes.length, honored: sub.honoredFilter };
});
await main.close();
console.log(JSON.stringify({ done: true, failed }));
process.exit(failed.length ? 1 : 0);
