#!/usr/bin/env bash
# Legacy HTTP+SSE test peer: the UNMODIFIED @modelcontextprotocol/server-everything@2026.8.31
# (TypeScript SDK 1.32.2 SSEServerTransport) in `sse` mode: GET /sse, POST /message?sessionId=<uuid>.
#
# Run (after scripts/install-peers):   tests/peers/run_everything.sh PORT
# The script `exec`s node, so the spawned pid IS the server's pid (kill it directly).
#
# Binding: server-everything itself calls `app.listen(PORT)`, i.e. ALL interfaces. The preload
# node/peer-preload.cjs adds host 127.0.0.1 to that call, so it listens on 127.0.0.1 only
# (PEER_BIND_ALL=1 restores upstream behaviour). Tests must only ever talk to 127.0.0.1.
# stdout: one JSON line once listening: {"ready":true,"port":PORT,"pid":PID,"sse_url":"http://127.0.0.1:PORT/sse"}
# stderr: server-everything's own logs ("Starting SSE server...", "Client Connected: <id>", ...).
# Exit: 1 if the port cannot be bound; 124 after PEER_LIFETIME_S (default 600, 0 = unlimited);
# 125 when orphaned (PEER_ORPHAN_EXIT=0 disables); dies by the signal on SIGTERM/SIGINT.
# Quirk (see WIRE-NOTES.md): a POST for an unknown sessionId is never answered (hangs) — always
# use client timeouts.
set -euo pipefail

if [ $# -ne 1 ] || ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ] || [ "$1" -gt 65535 ]; then
  echo "usage: $0 PORT" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=$here/node/node_modules/.bin/mcp-server-everything
if [ ! -e "$bin" ]; then
  echo "run_everything: $bin missing; run scripts/install-peers" >&2
  exit 1
fi
command -v node >/dev/null || { echo "run_everything: node missing" >&2; exit 1; }

export PORT=$1
exec node --require "$here/node/peer-preload.cjs" "$bin" sse
