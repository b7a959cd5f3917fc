#!/usr/bin/env python3
"""Legacy HTTP+SSE client test peer: the Python SDK's `mcp.client.sse.sse_client` + `ClientSession` (mcp==1.30.0).

What: connects to SSE_URL (an upstream FastMCP server or the proxy's legacy face), then
  initialize -> tools/list -> tools/call tick {n, interval_ms} with a progress callback
  (the SDK puts _meta.progressToken = request id) and a logging callback;
  optionally (--burst K) -> tools/call burst {n: K}.
Works against any legacy server whose tools include `tick` (e.g. fastmcp_legacy_server.py).

Run (after scripts/install-peers):
  tests/peers/.venv/bin/python tests/peers/sse_client_session.py http://127.0.0.1:PORT/sse \
      [--tick N=5] [--interval-ms M=200] [--burst K] [--timeout S]

stdout (one JSON line, only on success):
  {"tools": [...names], "progress": [[1,N,"step 1"], ...], "logs": ["tick 1", ...], "result": "done N",
   "session_id": "<session id from the endpoint URL>", "protocol_version": "...",
   ["burst": {"logs": ["burst 1", ...], "result": "burst K"}]}
  progress/logs are exactly what the SDK delivered to the callbacks, in arrival order (no de-duplication,
  no validation: the test asserts on them).
stderr: diagnostics. Exit: 0 ok; 1 any failure (connect, HTTP status, JSON-RPC error, tool isError);
  2 usage / non-loopback URL; 124 overall timeout (--timeout, env PEER_TIMEOUT_S, default 60 s).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _peerlib import DEFAULT_TIMEOUT_S, check_loopback, num, run, text_of  # noqa: E402
from mcp import ClientSession, types  # noqa: E402
from mcp.client.sse import sse_client  # noqa: E402

PROG = "sse_client_session"


def main() -> int:
    ap = argparse.ArgumentParser(prog=PROG, description="mcp sse_client session against a legacy server")
    ap.add_argument("sse_url")
    ap.add_argument("--tick", type=int, default=5, metavar="N")
    ap.add_argument("--interval-ms", type=int, default=200, metavar="M")
    ap.add_argument("--burst", type=int, default=None, metavar="K")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                    help="overall deadline in seconds (env PEER_TIMEOUT_S, default 60)")
    args = ap.parse_args()
    check_loopback(PROG, args.sse_url)

    async def body() -> dict[str, Any]:
        progress: list[list[Any]] = []
        logs: list[Any] = []
        session_ids: list[str] = []

        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            logs.append(params.data)

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append([num(p), num(total), message])

        per_request = timedelta(seconds=args.timeout)
        async with sse_client(args.sse_url, timeout=10, sse_read_timeout=args.timeout,
                              on_session_created=session_ids.append) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=per_request,
                                     logging_callback=on_log) as session:
                init = await session.initialize()
                tools = await session.list_tools()
                res = await session.call_tool("tick", {"n": args.tick, "interval_ms": args.interval_ms},
                                              progress_callback=on_progress)
                if res.isError:
                    raise RuntimeError(f"tick returned isError: {text_of(res)}")
                out: dict[str, Any] = {
                    "tools": [t.name for t in tools.tools],
                    "progress": progress,
                    "logs": list(logs),
                    "result": text_of(res),
                    "session_id": session_ids[0] if session_ids else None,
                    "protocol_version": init.protocolVersion,
                }
                if args.burst is not None:
                    logs.clear()
                    bres = await session.call_tool("burst", {"n": args.burst})
                    if bres.isError:
                        raise RuntimeError(f"burst returned isError: {text_of(bres)}")
                    out["burst"] = {"logs": list(logs), "result": text_of(bres)}
                return out

    return run(PROG, args.timeout, body)


if __name__ == "__main__":
    sys.exit(main())
