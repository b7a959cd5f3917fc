#!/usr/bin/env python3
"""Legacy HTTP+SSE (MCP 2024-11-05) test peer: the Python SDK's FastMCP (PyPI `mcp==1.30.0`).

What: an UNMODIFIED FastMCP server with transport "sse" (GET /sse, POST /messages/?session_id=<32 hex>),
bound to 127.0.0.1 only, exposing three tools for the proxy's integration tests:
  tick(n, interval_ms=200)  n x (notifications/progress "step i" + notifications/message "tick i"), sleeping
                            interval_ms after each step; returns "done n". Progress is only sent when the
                            request carries _meta.progressToken (standard FastMCP behaviour).
  echo(text)                returns text.
  burst(n)                  n x notifications/message "burst i" back-to-back, returns "burst n".

With --modern-tools (the 2026-07-28 face's tests) also:
  ask(question)             elicitation/create (form: {"answer": string}); returns "answer: <answer>" or
                            "declined: <action>".
  sample(prompt)            sampling/createMessage; returns "sampled: <text of the reply>".
  change()                  adds tool "extra" and sends notifications/tools/list_changed; returns "changed".
  slow(seconds, steps=4)    sleeps seconds in steps, reporting progress "step i"; returns "slept <seconds>".

Run (after scripts/install-peers):
  tests/peers/.venv/bin/python tests/peers/fastmcp_legacy_server.py PORT [--lifetime SECONDS] [--modern-tools]

stdout: exactly one JSON line once the socket is bound:
  {"ready": true, "port": PORT, "pid": PID, "sse_url": "http://127.0.0.1:PORT/sse"}
stderr: uvicorn / mcp diagnostics (uvicorn's access log is routed to stderr too).
Exit: on SIGTERM/SIGINT uvicorn shuts down gracefully (<= 2 s even with open SSE streams), then re-raises
  the signal, so the process dies BY the signal (shell status 143 for SIGTERM); 1 on bind/startup failure;
  124 when --lifetime (env PEER_LIFETIME_S, default 600 s, 0 = unlimited) expires;
  125 when orphaned (parent process died; disable with env PEER_ORPHAN_EXIT=0).
This is the code path of FastMCP.run(transport="sse") (run_sse_async: sse_app() served by uvicorn.Server),
inlined only so that readiness can be reported and logs kept off stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Annotated

import anyio
import uvicorn
from pydantic import Field
from mcp.server.fastmcp import Context, FastMCP

PROG = "fastmcp_legacy_server"


def log(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def add_modern_tools(mcp: FastMCP) -> None:
    from mcp.types import SamplingMessage, TextContent
    from pydantic import BaseModel

    class Answer(BaseModel):
        answer: str

    @mcp.tool()
    async def ask(question: str, ctx: Context) -> str:
        """Ask the client a question (elicitation)."""
        r = await ctx.elicit(question, schema=Answer)
        if r.action == "accept":
            return f"answer: {r.data.answer}"
        return f"declined: {r.action}"

    @mcp.tool()
    async def sample(prompt: str, ctx: Context) -> str:
        """Ask the client's model (sampling)."""
        r = await ctx.session.create_message(
            messages=[SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
            max_tokens=50,
        )
        text = r.content.text if isinstance(r.content, TextContent) else str(r.content)
        return f"sampled: {text}"

    @mcp.tool()
    async def routed(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})],
                     query: str = "") -> str:
        """A tool whose `region` argument 2026-07-28 clients mirror into `Mcp-Param-Region`."""
        return f"routed to {region}"

    @mcp.tool()
    async def ask_both(question: str, prompt: str, ctx: Context) -> str:
        """Ask the client a question and its model a prompt at once (two concurrent requests)."""
        got: dict = {}

        async def elicit() -> None:
            r = await ctx.elicit(question, schema=Answer)
            got["answer"] = r.data.answer if r.action == "accept" else r.action

        async def sample_() -> None:
            r = await ctx.session.create_message(
                messages=[SamplingMessage(role="user", content=TextContent(type="text", text=prompt))],
                max_tokens=50,
            )
            got["sampled"] = r.content.text if isinstance(r.content, TextContent) else str(r.content)

        async with anyio.create_task_group() as tg:
            tg.start_soon(elicit)
            tg.start_soon(sample_)
        return f"answer: {got['answer']}; sampled: {got['sampled']}"

    @mcp.tool()
    async def change(ctx: Context) -> str:
        """Add tool `extra` and tell the client the list changed."""

        def extra() -> str:
            return "extra"

        mcp.add_tool(extra, name="extra")
        await ctx.session.send_tool_list_changed()
        return "changed"

    @mcp.tool()
    async def slow(seconds: float, ctx: Context, steps: int = 4) -> str:
        """Sleep `seconds` in `steps` steps, reporting progress."""
        for i in range(steps):
            await anyio.sleep(seconds / steps)
            await ctx.report_progress(i + 1, steps, f"step {i + 1}")
        return f"slept {seconds:g}"


def build(port: int) -> FastMCP:
    mcp = FastMCP("legacy-peer", host="127.0.0.1", port=port)

    @mcp.tool()
    async def tick(n: int, ctx: Context, interval_ms: int = 200) -> str:
        """Report n progress steps and n info logs, sleeping interval_ms after each step."""
        for i in range(n):
            await ctx.report_progress(i + 1, n, f"step {i + 1}")
            await ctx.info(f"tick {i + 1}")
            await anyio.sleep(interval_ms / 1000)
        return f"done {n}"

    @mcp.tool()
    async def echo(text: str) -> str:
        """Return text unchanged."""
        return text

    @mcp.tool()
    async def burst(n: int, ctx: Context) -> str:
        """Send n info log notifications as fast as possible, then return."""
        for i in range(n):
            await ctx.info(f"burst {i + 1}")
        return f"burst {n}"

    return mcp


# uvicorn's default config sends the access log to stdout; keep stdout for JSON only.
LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stderr"}},
    "loggers": {
        "uvicorn": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        "uvicorn.error": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        "uvicorn.access": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
    },
}


async def serve(port: int, lifetime: float, orphan_exit: bool, modern: bool = False) -> int:
    mcp = build(port)
    if modern:
        add_modern_tools(mcp)
    config = uvicorn.Config(
        mcp.sse_app(),
        host=mcp.settings.host,
        port=mcp.settings.port,
        log_level=mcp.settings.log_level.lower(),
        log_config=LOG_CONFIG,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    parent = os.getppid()
    status = {"code": 0}

    async def watch() -> None:
        start = anyio.current_time()
        announced = False
        while True:
            await anyio.sleep(0.05 if not announced else 0.5)
            if not announced and server.started:
                print(
                    json.dumps({"ready": True, "port": port, "pid": os.getpid(),
                                "sse_url": f"http://127.0.0.1:{port}/sse"}),
                    flush=True,
                )
                announced = True
            if lifetime > 0 and anyio.current_time() - start > lifetime:
                log(f"lifetime of {lifetime:g} s expired, shutting down")
                status["code"] = 124
                server.should_exit = True
                return
            if orphan_exit and os.getppid() != parent:
                log("parent process died, shutting down")
                status["code"] = 125
                server.should_exit = True
                return
            if server.should_exit:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        try:
            await server.serve()
        except SystemExit as e:  # uvicorn: sys.exit(STARTUP_FAILURE) when the port cannot be bound
            log(f"uvicorn startup failed (SystemExit {e.code})")
            status["code"] = 1
        tg.cancel_scope.cancel()
    if status["code"] == 0 and not server.started:
        log("server stopped before it started")
        return 1
    return status["code"]


def main() -> int:
    ap = argparse.ArgumentParser(prog=PROG, description="FastMCP legacy SSE test peer")
    ap.add_argument("port", type=int)
    ap.add_argument("--lifetime", type=float, default=float(os.environ.get("PEER_LIFETIME_S", "600")),
                    help="exit (124) after this many seconds; 0 = unlimited (env PEER_LIFETIME_S, default 600)")
    ap.add_argument("--modern-tools", action="store_true",
                    help="also expose ask, sample, change and slow (2026-07-28 face tests)")
    args = ap.parse_args()
    if not 0 < args.port < 65536:
        ap.error("port out of range")
    orphan_exit = os.environ.get("PEER_ORPHAN_EXIT", "1") != "0"
    try:
        return anyio.run(serve, args.port, args.lifetime, orphan_exit, args.modern_tools)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
