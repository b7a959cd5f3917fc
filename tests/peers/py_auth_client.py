#!/usr/bin/env python3
"""An identified Streamable HTTP client test peer: the Python SDK's `streamablehttp_client` +
`ClientSession` (mcp==1.30.0), with extra request headers (e.g. `Authorization`) and TLS settings
given to the SDK's documented `httpx_client_factory` hook: the CA to trust (`--cafile`) and a client
certificate (`--cert`/`--key`, mutual TLS).

What: initialize (the SDK then opens the standalone GET stream by itself) -> optionally one
  tools/call TOOL {ARGS} with a progress callback -> waits for --expect-logs N log notifications ->
  leaves, which DELETEs the session. With --probe: initialize and leave at once WITHOUT a DELETE
  (a probing client, e.g. one that only checks which transport a server speaks).
  When the test cuts a connection, the SDK reconnects by itself: a POST stream that had a priming
  event id and the standalone GET stream both resume with GET + Last-Event-ID.

Run (after scripts/install-peers):
  tests/peers/.venv/bin/python tests/peers/py_auth_client.py https://127.0.0.1:PORT/mcp \
      [--header "Name: value"]... [--cafile CA.pem] [--cert C.pem --key K.pem] \
      [--tool NAME --args JSON] [--expect-logs N] [--probe] [--timeout S]

stdout: JSON lines only.
  {"event":"connected","session_id":...,"protocol_version":...}
  {"event":"progress","progress":P}     {"event":"log","data":...}      (as the SDK delivers them)
  last, on success: {"result": TEXT|null, "progress": [...], "logs": [...], "session_id": ...}
stderr: diagnostics. Exit: 0 ok; 1 failure; 2 usage / non-loopback URL; 124 overall timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import anyio  # noqa: E402
import httpx  # noqa: E402
from _peerlib import DEFAULT_TIMEOUT_S, check_loopback, num, run, text_of  # noqa: E402
from mcp import ClientSession, types  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402

PROG = "py_auth_client"


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(prog=PROG, description="identified streamablehttp_client session")
    ap.add_argument("url")
    ap.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'")
    ap.add_argument("--cafile", default=None)
    ap.add_argument("--cert", default=None)
    ap.add_argument("--key", default=None)
    ap.add_argument("--tool", default=None)
    ap.add_argument("--args", default="{}", metavar="JSON")
    ap.add_argument("--expect-logs", type=int, default=0, metavar="N")
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S")
    args = ap.parse_args()
    check_loopback(PROG, args.url)
    headers: dict[str, str] = {}
    for h in args.header:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            print(f"{PROG}: --header wants 'NAME: VALUE', got {h!r}", file=sys.stderr)
            return 2
        headers[name.strip()] = value.strip()

    verify: Any = True
    if args.cafile or args.cert:
        ctx = ssl.create_default_context(cafile=args.cafile)
        if args.cert:
            ctx.load_cert_chain(args.cert, args.key)
        verify = ctx

    def factory(headers: dict[str, str] | None = None, timeout: httpx.Timeout | None = None,
                auth: httpx.Auth | None = None) -> httpx.AsyncClient:
        # What the SDK's own create_mcp_http_client does, plus the TLS settings.
        return httpx.AsyncClient(headers=headers, timeout=timeout, auth=auth, verify=verify,
                                 follow_redirects=True)

    async def body() -> dict[str, Any]:
        progress: list[Any] = []
        logs: list[Any] = []

        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            logs.append(params.data)
            emit({"event": "log", "data": params.data})

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append(num(p))
            emit({"event": "progress", "progress": num(p)})

        async with streamablehttp_client(args.url, headers=headers, timeout=10,
                                         sse_read_timeout=args.timeout,
                                         terminate_on_close=not args.probe,
                                         httpx_client_factory=factory) as (read, write, get_session_id):
            async with ClientSession(read, write, read_timeout_seconds=timedelta(seconds=args.timeout),
                                     logging_callback=on_log) as session:
                init = await session.initialize()
                emit({"event": "connected", "session_id": get_session_id(),
                      "protocol_version": init.protocolVersion})
                result = None
                if args.tool is not None:
                    res = await session.call_tool(args.tool, json.loads(args.args),
                                                  progress_callback=on_progress)
                    if res.isError:
                        raise RuntimeError(f"{args.tool} returned isError: {text_of(res)}")
                    result = text_of(res)
                while len(logs) < args.expect_logs:
                    await anyio.sleep(0.05)
                return {"result": result, "progress": progress, "logs": list(logs),
                        "session_id": get_session_id()}

    return run(PROG, args.timeout, body)


if __name__ == "__main__":
    sys.exit(main())
