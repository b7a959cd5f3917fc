// Preload (`node --require`) used by tests/peers/run_everything.sh around the UNMODIFIED
// @modelcontextprotocol/server-everything. It touches nothing MCP-related; it only makes the
// peer behave like the other test peers:
//  - binds 127.0.0.1: server-everything calls `app.listen(PORT)` (all interfaces); a listen()
//    call given only a port gets host 127.0.0.1 added. Env PEER_BIND_ALL=1 disables this.
//  - prints ONE JSON line on stdout once listening: {"ready":true,"port":N,"pid":P,"sse_url":...}
//  - exits 1 when listen fails (express 5 hands EADDRINUSE to the listen callback, after which
//    server-everything would log "Server is running" and exit 0 with nothing listening).
//  - watchdog: exits 124 after PEER_LIFETIME_S seconds (default 600, 0 = unlimited) and 125 when
//    orphaned (parent died; PEER_ORPHAN_EXIT=0 disables).
// Diagnostics go to stderr, prefixed "run_everything:".
"use strict";
const net = require("node:net");

const tag = "run_everything:";
const bindAll = process.env.PEER_BIND_ALL === "1";
let announced = false;

const origListen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const first = args[0];
  const portOnly =
    (typeof first === "number" || (typeof first === "string" && /^\d+$/.test(first))) &&
    typeof args[1] !== "string";
  if (!bindAll && portOnly) {
    args.splice(1, 0, "127.0.0.1");
  }
  this.once("listening", () => {
    if (announced) return;
    announced = true;
    const a = this.address();
    const port = a && typeof a === "object" ? a.port : null;
    process.stdout.write(
      JSON.stringify({ ready: true, port, pid: process.pid, sse_url: `http://127.0.0.1:${port}/sse` }) + "\n",
    );
  });
  this.once("error", (err) => {
    if (announced) return;
    process.stderr.write(`${tag} listen failed: ${err && err.message}\n`);
    process.exit(1);
  });
  return origListen.apply(this, args);
};

const lifetime = Number(process.env.PEER_LIFETIME_S ?? "600");
if (!Number.isFinite(lifetime) || lifetime < 0) {
  process.stderr.write(`${tag} bad PEER_LIFETIME_S=${process.env.PEER_LIFETIME_S}\n`);
  process.exit(2);
}
if (lifetime > 0) {
  setTimeout(() => {
    process.stderr.write(`${tag} lifetime of ${lifetime} s expired, exiting\n`);
    process.exit(124);
  }, lifetime * 1000).unref();
}
if (process.env.PEER_ORPHAN_EXIT !== "0") {
  const parent = process.ppid;
  setInterval(() => {
    if (process.ppid !== parent) {
      process.stderr.write(`${tag} parent process died, exiting\n`);
      process.exit(125);
    }
  }, 500).unref();
}
