#!/usr/bin/env python3
"""Legacy-face reconnection probe: the Python SDK 1.30 `sse_client` runs a long FastMCP `tick` call; the
test cuts its connections mid-call (through a relay) and looks at what the client sends next.

Usage: .venv/bin/python sse_client_cut.py SSE_URL [--n N] [--interval-ms M] [--timeout S]
stdout: JSON lines {"event": "progress", "progress": p}, then {"result": text} or {"error": message}.
Exit 0 either way (the test judges).
"""
import argparse
import json
from datetime import timedelta

import anyio
from mcp import ClientSession
from mcp.client.sse import sse_client


def out(o):
    print(json.dumps(o), flush=True)


async def main(a):
    try:
        with anyio.fail_after(a.timeout):
            async with sse_client(a.url) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()

                    async def cb(p, total, message):
                        out({"event": "progress", "progress": p})
                    res = await s.call_tool("tick", {"n": a.n, "interval_ms": a.interval_ms}, progress_callback=cb,
                                            read_timeout_seconds=timedelta(seconds=a.timeout - 2))
                    out({"result": res.content[0].text})
    except BaseException as e:  # noqa: BLE001 (the test judges what happened)
        out({"error": f"{type(e).__name__}: {e}"[:300]})


ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("--n", type=int, default=10)
ap.add_argument("--interval-ms", type=int, default=300)
ap.add_argument("--timeout", type=float, default=20)
anyio.run(main, ap.parse_args())
