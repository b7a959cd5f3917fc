#!/usr/bin/env python3
"""Dual-era client peer for `modern.discover` (tests/modern_discover.rs): the Python SDK `mcp==2.3.0`
`Client` or `fastmcp==4.1.6`'s `Client` (venv tests/peers/.venv-modern), through the proxy's /mcp in
front of FastMCP (`fastmcp_legacy_server.py --modern-tools`), making one long call whose
connection the test severs mid-call.

Usage: .venv-modern/bin/python dual_era_client.py URL --client mcp|fastmcp [--mode auto|2026-07-28]
       [--steps N] [--timeout S]
stdout, one JSON line each:
  {"event": "connected", "version": V}          (or {"event": "connect_failed", "error": …})
  {"event": "progress", "progress": P}            per progress notification of the long call
  {"event": "call", "result": TEXT} | {"event": "call", "error": {"type", "msg"}}
  {"event": "echo", "result": TEXT}               a call after the cut, on the same client
  {"done": true}
Exit 0 when it got that far (the test judges the lines), 124 on timeout.
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio


def out(**kw) -> None:
    print(json.dumps(kw, default=repr), flush=True)


def text(r) -> str:
    content = getattr(r, "content", None) or []
    return "".join(getattr(c, "text", "") for c in content)


async def run(url: str, which: str, mode: str, steps: int) -> None:
    async def on_progress(progress, total, message):
        out(event="progress", progress=progress)

    if which == "fastmcp":
        from fastmcp import Client

        client = Client(url, mode=mode)
        call = lambda name, args, **kw: client.call_tool(  # noqa: E731
            name, args, progress_handler=kw.get("progress"), raise_on_error=False)
    else:
        from mcp import Client

        client = Client(url, mode=mode)
        call = lambda name, args, **kw: client.call_tool(  # noqa: E731
            name, args, progress_callback=kw.get("progress"))
    try:
        await client.__aenter__()
    except Exception as e:  # noqa: BLE001
        out(event="connect_failed", error={"type": type(e).__name__, "msg": str(e)[:800]})
        out(done=True)
        return
    try:
        out(event="connected", version=client.protocol_version)
        try:
            r = await call("tick", {"n": steps, "interval_ms": 300}, progress=on_progress)
            out(event="call", result=text(r), is_error=bool(getattr(r, "is_error", False) or getattr(r, "isError", False)))
        except Exception as e:  # noqa: BLE001
            out(event="call", error={"type": type(e).__name__, "msg": str(e)[:800]})
        r = await call("echo", {"text": "after the cut"})
        out(event="echo", result=text(r))
    finally:
        try:
            await client.__aexit__(None, None, None)
        except Exception:  # noqa: BLE001
            pass
    out(done=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--client", choices=["mcp", "fastmcp"], required=True)
    ap.add_argument("--mode", default="auto")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=90)
    a = ap.parse_args()

    async def bounded():
        with anyio.fail_after(a.timeout):
            await run(a.url, a.client, a.mode, a.steps)
    try:
        anyio.run(bounded)
    except TimeoutError:
        out(event="timeout")
        return 124
    return 0


if __name__ == "__main__":
    sys.exit(main())
