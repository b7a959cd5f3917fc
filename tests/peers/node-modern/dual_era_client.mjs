// Dual-era client peer for `modern.discover` (tests/modern_discover.rs): the TypeScript
// `@modelcontextprotocol/client@2.4.0` in `auto` mode (probes `server/discover`, falls back to
// `initialize`) or pinned to 2026-07-28, through the proxy's /mcp in front of FastMCP
// (`fastmcp_legacy_server.py --modern-tools`), making one long call whose connection the test
// severs mid-call.
//
// Usage: node dual_era_client.mjs URL [--mode auto|pin] [--steps N] [--timeout S]
// stdout, one JSON line each (as tests/peers/dual_era_client.py):
//   {"event":"connected","version":V} | {"event":"connect_failed","error":{...}}
//   {"event":"progress","progress":P} per progress notification of the long call
//   {"event":"call","result":TEXT} | {"event":"call","error":{...}}
//   {"event":"echo","result":TEXT}   a call after the cut, on the same client
//   {"done":true}
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const args = process.argv.slice(2);
const url = args[0];
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const mode = opt('--mode', 'auto');
const steps = Number(opt('--steps', '8'));
const timeout = Number(opt('--timeout', '90'));
setTimeout(() => { console.log(JSON.stringify({ event: 'timeout' })); process.exit(124); }, timeout * 1000).unref();

const out = (o) => console.log(JSON.stringify(o));
const text = (r) => (r?.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('');
const err = (e) => ({ name: e?.name, code: e?.code, message: String(e?.message ?? e).slice(0, 800) });
const versionNegotiation = mode === 'pin' ? { mode: { pin: '2026-07-28' } } : { mode: 'auto' };
const client = new Client({ name: 'dual-era-ts-peer', version: '2.4.0' }, { capabilities: {}, versionNegotiation });
const transport = new StreamableHTTPClientTransport(new URL(url));
try {
  await client.connect(transport);
} catch (e) {
  out({ event: 'connect_failed', error: err(e) });
  out({ done: true });
  process.exit(0);
}
out({ event: 'connected', version: client.getNegotiatedProtocolVersion?.() ?? transport.protocolVersion ?? null });
try {
  const r = await client.callTool({ name: 'tick', arguments: { n: steps, interval_ms: 300 } },
    { onprogress: (p) => out({ event: 'progress', progress: p.progress }), timeout: Number(opt('--call-timeout-ms', '15000')) });
  out({ event: 'call', result: text(r), is_error: !!r?.isError });
} catch (e) {
  out({ event: 'call', error: err(e) });
}
try {
  const r = await client.callTool({ name: 'echo', arguments: { text: 'after the cut' } });
  out({ event: 'echo', result: text(r) });
} catch (e) {
  out({ event: 'echo', error: err(e) });
}
await client.close().catch(() => {});
out({ done: true });
process.exit(0);
