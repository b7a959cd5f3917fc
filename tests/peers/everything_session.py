#!/usr/bin/env python3
"""Legacy HTTP+SSE client test peer against @modelcontextprotocol/server-everything (`sse` mode).

What: the Python SDK's `sse_client` + `ClientSession` (mcp==1.30.0) connects to SSE_URL (server-everything
directly, see run_everything.sh, or the proxy's legacy face in front of it), then
  initialize -> tools/list
  -> tools/call "trigger-long-running-operation" {duration: D, steps: S} with a progress callback
     (server-everything sends notifications/progress {progress: i, total: S} with NO message, one per
      step, sleeping D/S seconds before each, only because the SDK sets _meta.progressToken)
  -> tools/call "echo" {message: TEXT}   (server-everything answers "Echo: TEXT")
Names/arguments are from server-everything@2026.8.31 dist/tools/{trigger-long-running-operation,echo}.js.

Run (after scripts/install-peers):
  tests/peers/.venv/bin/python tests/peers/everything_session.py http://127.0.0.1:PORT/sse \
      [--duration D=2] [--steps S=4] [--echo TEXT=hello] [--timeout S]

stdout (one JSON line, only on success):
  {"tools": [...], "progress": [[1,4,null], ...], "result": "Long running operation completed. Duration: 2
   seconds, Steps: 4.", "echo": "Echo: hello", "session_id": "<uuid from endpoint>", "protocol_version": "..."}
stderr: diagnostics. Exit: 0 ok; 1 any failure; 2 usage / non-loopback URL;
  124 overall timeout (--timeout, env PEER_TIMEOUT_S, default 60 s).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _peerlib import DEFAULT_TIMEOUT_S, check_loopback, num, run, text_of  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.sse import sse_client  # noqa: E402

PROG = "everything_session"
LONG_OP = "trigger-long-running-operation"


def main() -> int:
    ap = argparse.ArgumentParser(prog=PROG, description="mcp sse_client session against server-everything")
    ap.add_argument("sse_url")
    ap.add_argument("--duration", type=float, default=2, metavar="D", help="seconds (default 2)")
    ap.add_argument("--steps", type=int, default=4, metavar="S", help="progress steps (default 4)")
    ap.add_argument("--echo", default="hello", metavar="TEXT")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                    help="overall deadline in seconds (env PEER_TIMEOUT_S, default 60)")
    args = ap.parse_args()
    check_loopback(PROG, args.sse_url)
    duration = num(args.duration)

    async def body() -> dict[str, Any]:
        progress: list[list[Any]] = []
        session_ids: list[str] = []

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append([num(p), num(total), message])

        per_request = timedelta(seconds=args.timeout)
        async with sse_client(args.sse_url, timeout=10, sse_read_timeout=args.timeout,
                              on_session_created=session_ids.append) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=per_request) as session:
                init = await session.initialize()
                tools = await session.list_tools()
                names = [t.name for t in tools.tools]
                if LONG_OP not in names:
                    raise RuntimeError(f"server has no {LONG_OP!r} tool: {names}")
                res = await session.call_tool(LONG_OP, {"duration": duration, "steps": args.steps},
                                              progress_callback=on_progress)
                if res.isError:
                    raise RuntimeError(f"{LONG_OP} returned isError: {text_of(res)}")
                echo = await session.call_tool("echo", {"message": args.echo})
                if echo.isError:
                    raise RuntimeError(f"echo returned isError: {text_of(echo)}")
                return {
                    "tools": names,
                    "progress": progress,
                    "result": text_of(res),
                    "echo": text_of(echo),
                    "session_id": session_ids[0] if session_ids else None,
                    "protocol_version": init.protocolVersion,
                }

    return run(PROG, args.timeout, body)


if __name__ == "__main__":
    sys.exit(main())
