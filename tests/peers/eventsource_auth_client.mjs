// A legacy SSE client as browsers and the TypeScript SDK's SSEClientTransport see the stream —
// the `eventsource` package (v3, the SDK's own dependency) with its automatic reconnection —
// sending extra request headers (e.g. `Authorization`) on its first request and on every
// reconnection, through the package's documented `fetch` option; the package's own headers
// (`Last-Event-ID` on a reconnection) are kept.
// (The SDK's SSEClientTransport itself cannot be used for this: its fetch wrapper replaces the
// headers the package set, so it reconnects without `Last-Event-ID`; see mcp-wire.md.)
// Prints one JSON line per happening on stdout: {"open":true}, {"error":...},
// {"event":"endpoint"|"message","id":...,"data":...}. Runs until killed (or 120 s).
// Usage: node eventsource_auth_client.mjs SSE_URL [--header "Name: value"]...
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, 'node', 'package.json'));
const { EventSource } = require('eventsource');

const [url, ...rest] = process.argv.slice(2);
if (!url || !url.startsWith('http://127.0.0.1:')) {
  console.error('usage: eventsource_auth_client.mjs http://127.0.0.1:PORT/sse [--header "K: V"]...');
  process.exit(2);
}
const extra = {};
for (let i = 0; i < rest.length; i++) {
  if (rest[i] !== '--header' || i + 1 >= rest.length) {
    console.error(`unexpected argument ${rest[i]}`);
    process.exit(2);
  }
  const h = rest[++i];
  const at = h.indexOf(':');
  extra[h.slice(0, at).trim()] = h.slice(at + 1).trim();
}
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const es = new EventSource(url, {
  fetch: (u, init) => {
    const headers = new Headers(init?.headers ?? {});
    for (const [k, v] of Object.entries(extra)) headers.set(k, v);
    return fetch(u, { ...init, headers });
  },
});
es.onopen = () => out({ open: true });
es.onerror = (e) => out({ error: String(e?.message ?? e?.type ?? 'error') });
es.addEventListener('endpoint', (e) => out({ event: 'endpoint', id: e.lastEventId, data: e.data }));
es.addEventListener('message', (e) => out({ event: 'message', id: e.lastEventId, data: e.data }));
setTimeout(() => { es.close(); process.exit(0); }, 120_000);
