#!/usr/bin/env python3
"""MCP 2026-07-28 client peer: the Python SDK `mcp==2.3.0` (venv tests/peers/.venv-modern) through the
proxy's /mcp, in front of a legacy upstream.

Usage: .venv-modern/bin/python modern_py_client.py URL KIND [--mode 2026-07-28|auto] [--timeout S]
  KIND: fastmcp (fastmcp_legacy_server.py --modern-tools) | everything (server-everything sse)
Runs: connect, list, call, progress, (fastmcp) logLevel-gated logs, an MRTR round trip (fastmcp:
elicitation via `ask`; everything: sampling via `trigger-sampling-request`), and a listen that must
receive a tools/list_changed (fastmcp: tool `change`; everything: a second client with other
capabilities, for which the proxy opens another upstream session).
stdout: one JSON line {"step", "ok", "detail"} per step, then {"done": true, "failed": [...]}.
Exit 0 when every step passed, 1 otherwise, 124 on timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import anyio
import mcp_types as types
from mcp import Client

failed: list[str] = []


def out(step: str, ok: bool, detail) -> None:
    if not ok:
        failed.append(step)

    def conv(o):
        if hasattr(o, "model_dump"):
            return o.model_dump(by_alias=True, exclude_none=True, mode="json")
        return repr(o)

    print(json.dumps({"step": step, "ok": ok, "detail": detail}, default=conv), flush=True)


def text(r) -> str:
    return "".join(c.text for c in r.content if getattr(c, "type", None) == "text")


class CheckFailed(Exception):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise CheckFailed(what)


async def elicitation_cb(ctx, params):
    return types.ElicitResult(action="accept", content={"answer": "forty-two"})


async def sampling_cb(ctx, params):
    return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="py sample"),
                                     model="peer-model", stop_reason="endTurn")


async def roots_cb(ctx):
    return types.ListRootsResult(roots=[types.Root(uri="file:///tmp", name="tmp")])


logs: list = []


async def logging_cb(params):
    logs.append(params.data)


async def run(url: str, kind: str, mode: str) -> None:
    info = types.Implementation(name="modern-py-peer", version="2.3.0")
    kw = dict(mode=mode, elicitation_callback=elicitation_cb, sampling_callback=sampling_cb,
              logging_callback=logging_cb, client_info=info)
    async with Client(url, **kw) as client:
        out("connect", True, {"version": client.protocol_version})

        async def step(name, fn):
            try:
                out(name, True, await fn())
            except Exception as e:  # noqa: BLE001
                out(name, False, {"type": type(e).__name__, "msg": str(e)[:600]})

        async def connect():
            check(client.protocol_version == "2026-07-28", f"version {client.protocol_version}")
            return client.protocol_version
        await step("version", connect)

        async def list_():
            names = [t.name for t in (await client.list_tools()).tools]
            check("echo" in names, "echo listed")
            return names
        await step("list", list_)

        async def call():
            args = {"text": "hi modern"} if kind == "fastmcp" else {"message": "hi modern"}
            r = await client.call_tool("echo", args)
            check("hi modern" in text(r), f"echo {text(r)}")
            return text(r)
        await step("call", call)

        async def progress():
            got = []

            async def cb(p, total, message):
                got.append(p)
            if kind == "fastmcp":
                r = await client.call_tool("tick", {"n": 3, "interval_ms": 50}, progress_callback=cb)
            else:
                r = await client.call_tool("trigger-long-running-operation", {"duration": 1, "steps": 3},
                                           progress_callback=cb)
            check(got == [1, 2, 3], f"progress {got}")
            return {"result": text(r), "progress": got}
        await step("progress", progress)

        if kind == "fastmcp":
            async def loglevel():
                logs.clear()
                await client.call_tool("tick", {"n": 2, "interval_ms": 20})
                without = len(logs)
                await client.call_tool("tick", {"n": 2, "interval_ms": 20},
                                       meta={"io.modelcontextprotocol/logLevel": "info"})
                check(without == 0, f"no logs without logLevel ({without})")
                check(logs == ["tick 1", "tick 2"], f"logs with logLevel {logs}")
                return {"without": without, "with": logs}
            await step("loglevel", loglevel)

        async def mrtr():
            if kind == "fastmcp":
                r = await client.call_tool("ask", {"question": "the answer?"})
                check(text(r) == "answer: forty-two", text(r))
            else:
                r = await client.call_tool("trigger-sampling-request", {"prompt": "hello", "maxTokens": 20})
                check("py sample" in text(r), text(r))
            return text(r)
        await step("mrtr", mrtr)

        async def listen():
            got = []
            async with client.listen(tools_list_changed=True) as sub:
                honored = sub.honored

                async def trigger():
                    if kind == "fastmcp":
                        await client.call_tool("change", {})
                    else:
                        async with Client(url, mode=mode, list_roots_callback=roots_cb, client_info=info) as other:
                            await other.call_tool("echo", {"message": "from another client"})

                async with anyio.create_task_group() as tg:
                    tg.start_soon(trigger)
                    with anyio.move_on_after(10):
                        async for ev in sub:
                            got.append(type(ev).__name__)
                            break
            check(len(got) >= 1, "a tools/list_changed on the listen stream")
            return {"honored": honored, "got": got}
        await step("listen", listen)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("kind", choices=["fastmcp", "everything"])
    ap.add_argument("--mode", default="2026-07-28")
    ap.add_argument("--timeout", type=float, default=float(os.environ.get("PEER_TIMEOUT_S", "60")))
    a = ap.parse_args()

    async def guarded():
        with anyio.fail_after(a.timeout):
            await run(a.url, a.kind, a.mode)
    try:
        anyio.run(guarded)
    except TimeoutError:
        print("modern_py_client: timeout", file=sys.stderr)
        return 124
    except Exception as e:  # noqa: BLE001
        out("connect", False, {"type": type(e).__name__, "msg": str(e)[:800]})
    print(json.dumps({"done": True, "failed": failed}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
