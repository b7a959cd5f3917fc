#!/usr/bin/env python3
"""fastmcp 4.1.6's `Client` (venv tests/peers/.venv-modern) as a cell of the third-party interop
matrix (tests/interop.rs): one long `tick` call with a progress handler and a log handler, over the
transport the URL names, through a relay the test severs mid-call. Unmodified client; default
`mode="auto"` (over /sse fastmcp negotiates the legacy handshake directly).

Usage: .venv-modern/bin/python interop_fastmcp_client.py URL --transport sse|http [--steps N]
       [--interval-ms M] [--timeout S]
stdout, one JSON line each:
  {"event": "connected", "version": V}
  {"event": "progress", "progress": P}        per progress notification the client delivered
  {"event": "log", "data": D}                 per log notification the client delivered
  {"event": "call", "result": TEXT, "is_error": B} | {"event": "call", "error": {"type", "msg"}}
  {"done": true}
Exit 0 when it got that far, 124 on timeout (the test kills it sooner when the call is lost).
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio


def out(**kw) -> None:
    print(json.dumps(kw, default=repr), flush=True)


async def run(url: str, transport: str, steps: int, interval_ms: int) -> None:
    from fastmcp import Client
    from fastmcp.client.transports import SSETransport, StreamableHttpTransport

    async def on_progress(progress, total, message):
        out(event="progress", progress=progress)

    async def on_log(msg):
        out(event="log", data=msg.data)

    t = SSETransport(url) if transport == "sse" else StreamableHttpTransport(url)
    async with Client(t, log_handler=on_log) as client:
        out(event="connected", version=client.protocol_version)
        try:
            r = await client.call_tool("tick", {"n": steps, "interval_ms": interval_ms},
                                       progress_handler=on_progress, raise_on_error=False)
            text = "".join(getattr(c, "text", "") for c in (r.content or []))
            out(event="call", result=text, is_error=bool(r.is_error))
        except Exception as e:  # noqa: BLE001
            out(event="call", error={"type": type(e).__name__, "msg": str(e)[:800]})
    out(done=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--transport", choices=["sse", "http"], required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--interval-ms", type=int, default=300)
    ap.add_argument("--timeout", type=float, default=60)
    a = ap.parse_args()

    async def bounded():
        with anyio.fail_after(a.timeout):
            await run(a.url, a.transport, a.steps, a.interval_ms)
    try:
        anyio.run(bounded)
    except TimeoutError:
        out(event="timeout")
        return 124
    return 0


if __name__ == "__main__":
    sys.exit(main())
