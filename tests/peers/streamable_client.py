#!/usr/bin/env python3
"""Streamable HTTP client test peer: the Python SDK's `streamablehttp_client` + `ClientSession` (mcp==1.30.0).

What: connects to URL (the proxy's Streamable HTTP endpoint), then
  initialize -> tools/list -> tools/call TOOL {ARGS} with a progress callback (the SDK sets
  _meta.progressToken = request id) and a logging callback -> optionally (--echo JSON) tools/call echo
  -> waits for --expect-logs N log notifications (they travel on the standalone GET stream, which the
  SDK opens by itself after initialization) -> leaves, which DELETEs the session (terminate_on_close).
Works against the proxy in front of any legacy server (tool names and arguments are given).

Run (after scripts/install-peers):
  tests/peers/.venv/bin/python tests/peers/streamable_client.py http://127.0.0.1:PORT/mcp \
      --tool NAME --args JSON [--echo JSON] [--expect-logs N] [--timeout S]

stdout (one JSON line, only on success):
  {"tools": [...names], "progress": [[p, total, message], ...], "logs": [...], "result": TEXT,
   "session_id": "<Mcp-Session-Id>", "protocol_version": "...", ["echo": TEXT]}
  progress/logs are exactly what the SDK delivered to the callbacks, in arrival order (no de-duplication).
stderr: diagnostics. Exit: 0 ok; 1 any failure (connect, HTTP status, JSON-RPC error, tool isError);
  2 usage / non-loopback URL; 124 overall timeout (--timeout, env PEER_TIMEOUT_S, default 60 s).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import anyio  # noqa: E402
from _peerlib import DEFAULT_TIMEOUT_S, check_loopback, num, run, text_of  # noqa: E402
from mcp import ClientSession, types  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402

PROG = "streamable_client"


def main() -> int:
    ap = argparse.ArgumentParser(prog=PROG, description="mcp streamablehttp_client session against the proxy")
    ap.add_argument("url")
    ap.add_argument("--tool", required=True)
    ap.add_argument("--args", default="{}", metavar="JSON")
    ap.add_argument("--echo", default=None, metavar="JSON")
    ap.add_argument("--expect-logs", type=int, default=0, metavar="N")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                    help="overall deadline in seconds (env PEER_TIMEOUT_S, default 60)")
    args = ap.parse_args()
    check_loopback(PROG, args.url)
    tool_args = json.loads(args.args)

    async def body() -> dict[str, Any]:
        progress: list[list[Any]] = []
        logs: list[Any] = []

        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            logs.append(params.data)

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append([num(p), num(total), message])

        per_request = timedelta(seconds=args.timeout)
        async with streamablehttp_client(args.url, timeout=10, sse_read_timeout=args.timeout) as (
            read, write, get_session_id):
            async with ClientSession(read, write, read_timeout_seconds=per_request,
                                     logging_callback=on_log) as session:
                init = await session.initialize()
                tools = await session.list_tools()
                res = await session.call_tool(args.tool, tool_args, progress_callback=on_progress)
                if res.isError:
                    raise RuntimeError(f"{args.tool} returned isError: {text_of(res)}")
                out: dict[str, Any] = {
                    "tools": [t.name for t in tools.tools],
                    "progress": progress,
                    "result": text_of(res),
                    "session_id": get_session_id(),
                    "protocol_version": init.protocolVersion,
                }
                if args.echo is not None:
                    eres = await session.call_tool("echo", json.loads(args.echo))
                    if eres.isError:
                        raise RuntimeError(f"echo returned isError: {text_of(eres)}")
                    out["echo"] = text_of(eres)
                while len(logs) < args.expect_logs:
                    await anyio.sleep(0.05)
                out["logs"] = list(logs)
                return out

    return run(PROG, args.timeout, body)


if __name__ == "__main__":
    sys.exit(main())
