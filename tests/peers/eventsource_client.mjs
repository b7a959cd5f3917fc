// A legacy SSE client as browsers and the TypeScript SDK's SSEClientTransport see the stream:
// the `eventsource` package (v3, the SDK's own dependency) with its automatic reconnection.
// Prints one JSON line per happening on stdout: {"open":true}, {"error":...},
// {"event":"endpoint"|"message","id":...,"data":...}. Runs until killed (or 120 s).
// Usage: node eventsource_client.mjs SSE_URL
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, 'node', 'package.json'));
const { EventSource } = require('eventsource');

const url = process.argv[2];
if (!url || !url.startsWith('http://127.0.0.1:')) {
  console.error('usage: eventsource_client.mjs http://127.0.0.1:PORT/sse');
  process.exit(2);
}
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const es = new EventSource(url);
es.onopen = () => out({ open: true });
es.onerror = (e) => out({ error: String(e?.message ?? e?.type ?? 'error') });
es.addEventListener('endpoint', (e) => out({ event: 'endpoint', id: e.lastEventId, data: e.data }));
es.addEventListener('message', (e) => out({ event: 'message', id: e.lastEventId, data: e.data }));
setTimeout(() => { es.close(); process.exit(0); }, 120_000);
