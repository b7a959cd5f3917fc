// Legacy-face reconnection probe: the TypeScript SDK 1.32.2 `SSEClientTransport` (the SDK's own
// legacy HTTP+SSE client, which uses the `eventsource` package) runs a long FastMCP `tick` call;
// the test cuts its connections mid-call (through a relay) and looks at what the client sends next.
//
// Usage: node sse_transport_client.mjs SSE_URL [--n N] [--interval-ms M] [--timeout S]
// stdout: JSON lines {"event":"progress","progress":p} as they arrive, then one final line
// {"result": text} or {"error": message}. Exit 0 either way (the test judges); 124 on timeout.
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const sdk = path.join(here, 'node', 'node_modules', '@modelcontextprotocol', 'sdk', 'dist', 'esm');
const { Client } = await import(pathToFileURL(path.join(sdk, 'client', 'index.js')).href);
const { SSEClientTransport } = await import(pathToFileURL(path.join(sdk, 'client', 'sse.js')).href);

const argv = process.argv.slice(2);
const opt = (name, dflt) => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] : dflt; };
const url = argv[0];
const n = Number(opt('--n', '10'));
const interval = Number(opt('--interval-ms', '300'));
const timeout = Number(opt('--timeout', '30'));
setTimeout(() => { console.log(JSON.stringify({ error: 'timeout' })); process.exit(124); }, timeout * 1000).unref();

const client = new Client({ name: 'sse-transport-probe', version: '1' }, { capabilities: {} });
client.onerror = (e) => console.log(JSON.stringify({ event: 'transport_error', message: String(e?.message ?? e) }));
await client.connect(new SSEClientTransport(new URL(url)));
try {
  const r = await client.callTool({ name: 'tick', arguments: { n, interval_ms: interval } }, undefined, {
    onprogress: (p) => console.log(JSON.stringify({ event: 'progress', progress: p.progress })),
    timeout: (timeout - 2) * 1000,
  });
  console.log(JSON.stringify({ result: r.content?.[0]?.text }));
} catch (e) {
  console.log(JSON.stringify({ error: String(e?.message ?? e) }));
}
process.exit(0);
