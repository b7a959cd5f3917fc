"""Shared helpers for the Python client peers (sse_client_session.py, everything_session.py).

Not a peer itself. Keeps the CLI/timeout/exit-code conventions identical across peers:
stdout = exactly one JSON line on success; stderr = diagnostics; exit 0 ok, 1 failure, 124 timeout.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

import anyio
from mcp import types

DEFAULT_TIMEOUT_S = float(os.environ.get("PEER_TIMEOUT_S", "60"))


def num(x: float | None) -> float | int | None:
    """Progress values arrive as floats (pydantic `float`); print 3.0 as 3."""
    if x is None:
        return None
    return int(x) if float(x).is_integer() else x


def check_loopback(prog: str, url: str) -> None:
    host = urlsplit(url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"{prog}: refusing non-loopback URL {url!r}", file=sys.stderr, flush=True)
        sys.exit(2)


def text_of(result: types.CallToolResult) -> str:
    parts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    if not parts:
        raise RuntimeError(f"tool result has no text content: {result.model_dump_json()}")
    return "\n".join(parts)


def run(prog: str, timeout_s: float, body: Callable[[], Awaitable[dict[str, Any]]]) -> int:
    """Run `body` under an overall deadline; print its dict as one JSON line."""

    async def wrapped() -> dict[str, Any]:
        with anyio.fail_after(timeout_s):
            return await body()

    try:
        out = anyio.run(wrapped)
    except TimeoutError:
        print(f"{prog}: overall timeout of {timeout_s:g} s expired", file=sys.stderr, flush=True)
        return 124
    except BaseException as e:  # noqa: BLE001 - includes ExceptionGroup from anyio task groups
        if isinstance(e, KeyboardInterrupt):
            return 130
        # an overall-timeout that surfaced inside a task group
        if isinstance(e, BaseExceptionGroup) and e.subgroup(lambda x: isinstance(x, TimeoutError)):
            print(f"{prog}: timeout: {e!r}", file=sys.stderr, flush=True)
            traceback.print_exception(e, file=sys.stderr)
            return 124
        print(f"{prog}: failed: {e!r}", file=sys.stderr, flush=True)
        traceback.print_exception(e, file=sys.stderr)
        return 1
    print(json.dumps(out), flush=True)
    return 0
