#!/usr/bin/env python3
"""Legacy HTTP+SSE (MCP 2024-11-05) fixture server for the official conformance suite, run through
the proxy: the Python SDK's low-level Server (PyPI `mcp==1.30.0`) on its SseServerTransport
(GET /sse, POST /messages/?session_id=<32 hex>), bound to 127.0.0.1 only.

What: every fixture tool, prompt, resource, resource template and completion that the server
scenarios of `@modelcontextprotocol/conformance@0.2.0-alpha.12` expect (`--requirements 2026-07-28`),
with the behaviour of the suite's reference server (examples/servers/typescript/everything-server.ts)
and of the scenario descriptions, but as a LEGACY server can have it:

- The 2026-07-28 MRTR fixtures (test_input_required_result_*, the prompt
  test_input_required_result_prompt) ask the client with the legacy server's own server->client
  requests (elicitation/create, sampling/createMessage, roots/list) while the call runs; the proxy
  turns them into InputRequiredResult rounds. Each request's JSON-RPC id is the key the suite expects
  in `inputRequests` ("user_name", "capital_question", "client_roots", "confirm", "step1", ...),
  because the proxy keys input requests by the upstream's own ids. Several requests asked at once
  (test_input_required_result_multiple_inputs, multi_input) are sent concurrently.
- The Tasks fixtures (greet, slow_compute, failing_job, protocol_error_job, confirm_delete,
  multi_input, test_tool_with_task) are plain tools: the proxy makes a call a task itself (its
  tasks.after_ms timer); the "parks for elicitation" tools work for a while first, so that they are
  tasks before they ask.
- Diagnostic tools: test_missing_capability asks for sampling whatever the client declared (the
  proxy must refuse an undeclared capability with -32021); test_logging_tool logs (the proxy must
  not forward a log to a request without a logLevel); test_trigger_tool_change /
  test_trigger_prompt_change send list_changed to EVERY live session (the proxy's
  subscriptions/listen streams run on other upstream sessions than the call that triggers them);
  test_custom_headers has `x-mcp-header` parameters (Mcp-Param-* validation is the proxy's job).

Run (after scripts/install-peers):
  tests/peers/.venv/bin/python tests/peers/conformance_fixture_server.py PORT [--lifetime SECONDS]

stdout: exactly one JSON line once the socket is bound:
  {"ready": true, "port": PORT, "pid": PID, "sse_url": "http://127.0.0.1:PORT/sse"}
stderr: uvicorn / mcp diagnostics and `conformance_fixture_server: ...` lines.
Exit: 0 after SIGTERM/SIGINT (uvicorn shuts down gracefully, <= 2 s); 1 on bind/startup failure;
  124 when --lifetime (env PEER_LIFETIME_S, default 600 s, 0 = unlimited) expires;
  125 when orphaned (parent process died; disable with env PEER_ORPHAN_EXIT=0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
import weakref
from typing import Any

import anyio
import uvicorn
from mcp import types
from mcp.server.lowlevel import server as lowlevel
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.sse import SseServerTransport
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import McpError
from mcp.shared.message import SessionMessage
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

PROG = "conformance_fixture_server"

# A server->client request the client never answers fails the call after this.
ASK_TIMEOUT_S = 120


def log(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


# ---- every live session, for list_changed broadcasts ------------------------------------------

SESSIONS: "weakref.WeakSet[ServerSession]" = weakref.WeakSet()


class TrackedSession(ServerSession):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tag = uuid.uuid4().hex[:6]
        SESSIONS.add(self)


def tag(session: ServerSession) -> str:
    return getattr(session, "tag", "?")


# Server.run builds its session from this module global.
lowlevel.ServerSession = TrackedSession  # type: ignore[misc]


async def broadcast(notification: types.ServerNotification) -> int:
    n = 0
    for s in list(SESSIONS):
        try:
            await s.send_notification(notification)
            n += 1
        except Exception:  # closed session
            SESSIONS.discard(s)
    return n


# ---- server->client requests with chosen ids --------------------------------------------------


async def ask(session: ServerSession, key: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send `method` to the client with JSON-RPC id `key` and return its result (raw dict).

    BaseSession.send_request numbers its requests 0, 1, ...; the suite expects the keys of
    `inputRequests` to be names, and the proxy uses the upstream's ids as those keys, so this sends
    the request itself and waits on the session's response table the same way send_request does
    (string ids stay strings: BaseSession._normalize_request_id only turns numeric strings into
    ints)."""
    streams = session._response_streams  # noqa: SLF001 - the SDK's own response routing
    rid: str = key
    if rid in streams:  # the same name still pending on this session: keep ids unique
        rid = f"{key}-{uuid.uuid4().hex[:8]}"
    send, recv = anyio.create_memory_object_stream[Any](1)
    streams[rid] = send
    try:
        log(f"[{tag(session)}] asks {method} id={rid!r}")
        req = types.JSONRPCRequest(jsonrpc="2.0", id=rid, method=method, params=params)
        await session._write_stream.send(SessionMessage(message=types.JSONRPCMessage(req)))  # noqa: SLF001
        with anyio.fail_after(ASK_TIMEOUT_S):
            resp = await recv.receive()
    finally:
        streams.pop(rid, None)
        await send.aclose()
        await recv.aclose()
    log(f"[{tag(session)}] answer to {rid!r}: {'error' if isinstance(resp, types.JSONRPCError) else 'result'}")
    if isinstance(resp, types.JSONRPCError):
        raise McpError(resp.error)
    return resp.result or {}


def elicit_params(message: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"message": message, "requestedSchema": {"type": "object", "properties": props, "required": required}}


def sampling_params(text: str, max_tokens: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": {"type": "text", "text": text}}], "maxTokens": max_tokens}


def content_field(result: dict[str, Any], field: str, default: str = "unknown") -> Any:
    c = result.get("content")
    if isinstance(c, dict) and field in c:
        return c[field]
    return default


def sample_text(result: dict[str, Any], default: str = "no response") -> str:
    c = result.get("content")
    if isinstance(c, dict) and isinstance(c.get("text"), str):
        return c["text"]
    return default


# ---- fixtures -----------------------------------------------------------------------------------

# 1x1 red PNG and a minimal WAV, as the reference server.
IMAGE = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
AUDIO = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}

NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}}


def schema(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        s["required"] = required
    return s


STR = {"type": "string"}
TOOLS: list[tuple[str, str, dict[str, Any]]] = [
    # tools-* scenarios
    ("test_simple_text", "Tests simple text content response", NO_ARGS),
    ("test_image_content", "Tests image content response", NO_ARGS),
    ("test_audio_content", "Tests audio content response", NO_ARGS),
    ("test_embedded_resource", "Tests embedded resource content response", NO_ARGS),
    ("test_multiple_content_types", "Tests response with multiple content types (text, image, resource)", NO_ARGS),
    ("test_tool_with_logging", "Tests tool that emits log messages during execution", NO_ARGS),
    ("test_tool_with_progress", "Tests tool that reports progress notifications", NO_ARGS),
    ("test_error_handling", "Tests error response handling", NO_ARGS),
    ("test_reconnection", "Tests SSE stream reconnection (a legacy server cannot close the stream; sleeps 100 ms)", NO_ARGS),
    ("test_sampling", "Tests server-initiated sampling (LLM completion request)",
     schema({"prompt": {"type": "string", "description": "The prompt to send to the LLM"}}, ["prompt"])),
    ("test_elicitation", "Tests server-initiated elicitation (user input request)",
     schema({"message": {"type": "string", "description": "The message to show the user"}}, ["message"])),
    ("test_elicitation_sep1034_defaults", "Tests elicitation with default values per SEP-1034", NO_ARGS),
    ("test_elicitation_sep1330_enums", "Tests elicitation with enum schema improvements per SEP-1330", NO_ARGS),
    ("json_schema_2020_12_tool", "Tool with JSON Schema 2020-12 features for conformance testing (SEP-1613)",
     JSON_SCHEMA_2020_12),
    ("test_custom_headers", "A tool with x-mcp-header annotations to test custom header mirroring and encoding",
     schema({
         "region": {"type": "string", "description": "Plain ASCII string value", "x-mcp-header": "Region"},
         "priority": {"type": "integer", "description": "Integer numeric value", "x-mcp-header": "Priority"},
         "verbose": {"type": "boolean", "description": "Boolean value", "x-mcp-header": "Verbose"},
     })),
    # server-stateless diagnostics
    ("test_missing_capability", "Test tool requiring sampling", NO_ARGS),
    ("test_streaming_elicitation", "Diagnostic tool validating response progress streams", NO_ARGS),
    ("test_logging_tool", "Diagnostic logging validator tool", NO_ARGS),
    ("test_trigger_tool_change", "Sends notifications/tools/list_changed to every session", NO_ARGS),
    ("test_trigger_prompt_change", "Sends notifications/prompts/list_changed to every session", NO_ARGS),
    # input-required-result-* (SEP-2322 MRTR), asked with server->client requests
    ("test_input_required_result_elicitation", "MRTR: asks elicitation user_name", NO_ARGS),
    ("test_input_required_result_sampling", "MRTR: asks sampling capital_question", NO_ARGS),
    ("test_input_required_result_list_roots", "MRTR: asks roots/list client_roots", NO_ARGS),
    ("test_input_required_result_request_state", "MRTR: asks elicitation confirm", NO_ARGS),
    ("test_input_required_result_multiple_inputs", "MRTR: asks user_name, greeting and client_roots at once", NO_ARGS),
    ("test_input_required_result_multi_round", "MRTR: asks step1, then step2", NO_ARGS),
    ("test_input_required_result_tampered_state", "MRTR: asks elicitation confirm", NO_ARGS),
    ("test_input_required_result_capabilities", "MRTR: asks what the client's capabilities allow", NO_ARGS),
    # tasks-* (SEP-2663): the proxy makes slow calls tasks
    ("greet", "Sync: returns Hello, {name}!", schema({"name": STR}, ["name"])),
    ("slow_compute", "Sleeps `seconds` seconds, then returns a result",
     schema({"seconds": {"type": "number"}, "label": STR})),
    ("failing_job", "Returns a tool execution error after ~1 s", NO_ARGS),
    ("protocol_error_job", "Fails with a JSON-RPC (protocol) error after ~1 s", NO_ARGS),
    ("confirm_delete", "Works ~0.8 s, then asks elicitation confirm; deletes on accept",
     schema({"filename": STR}, ["filename"])),
    ("multi_input", "Works ~0.8 s, then asks two elicitations at once", NO_ARGS),
    ("test_tool_with_task", "Asks user_name, then works ~1.5 s (a task) and greets", NO_ARGS),
]

# The task support the tasks scenarios' descriptions give each tool, as the 2025-11-25 vocabulary
# `execution.taskSupport` (a 2024-11-05 client ignores it). The proxy does not relay it to 2026-07-28
# clients (its tasks are decided by its own timer) but honours "required": a call from a client
# without the tasks extension is refused -32021 (src/facade/modern/task_support.rs).
TASK_SUPPORT = {
    "slow_compute": "optional",
    "failing_job": "required",
    "protocol_error_job": "optional",
    "confirm_delete": "optional",
    "multi_input": "optional",
    "test_tool_with_task": "required",
}

RESOURCES = [
    types.Resource(uri="test://static-text", name="static-text", title="Static Text Resource",
                   description="A static text resource for testing", mimeType="text/plain"),
    types.Resource(uri="test://static-binary", name="static-binary", title="Static Binary Resource",
                   description="A static binary resource (image) for testing", mimeType="image/png"),
    types.Resource(uri="test://watched-resource", name="watched-resource", title="Watched Resource",
                   description="A resource for subscriptions", mimeType="text/plain"),
]
TEMPLATES = [
    types.ResourceTemplate(uriTemplate="test://template/{id}/data", name="template", title="Resource Template",
                           description="A resource template with parameter substitution",
                           mimeType="application/json"),
]
PROMPTS = [
    types.Prompt(name="test_simple_prompt", title="Simple Test Prompt", description="A simple prompt without arguments"),
    types.Prompt(name="test_prompt_with_arguments", title="Prompt With Arguments",
                 description="A prompt with required arguments",
                 arguments=[types.PromptArgument(name="arg1", description="First test argument", required=True),
                            types.PromptArgument(name="arg2", description="Second test argument", required=True)]),
    types.Prompt(name="test_prompt_with_embedded_resource", title="Prompt With Embedded Resource",
                 description="A prompt that includes an embedded resource",
                 arguments=[types.PromptArgument(name="resourceUri", description="URI of the resource to embed",
                                                 required=True)]),
    types.Prompt(name="test_prompt_with_image", title="Prompt With Image", description="A prompt that includes image content"),
    types.Prompt(name="test_input_required_result_prompt", description="MRTR: prompt that asks elicitation user_context"),
]


def text(t: str) -> types.TextContent:
    return types.TextContent(type="text", text=t)


def result(*content: Any, is_error: bool = False) -> types.ServerResult:
    return types.ServerResult(types.CallToolResult(content=list(content), isError=is_error))


def build() -> tuple[lowlevel.Server, InitializationOptions]:
    server: lowlevel.Server = lowlevel.Server("mcp-conformance-fixture-server", version="1.0.0")
    subscriptions: set[str] = set()

    def rctx() -> Any:
        return server.request_context

    async def progress(token: Any, done: float, total: float, message: str) -> None:
        c = rctx()
        if token is not None:
            await c.session.send_progress_notification(token, done, total, message, related_request_id=c.request_id)

    async def info(message: str) -> None:
        c = rctx()
        await c.session.send_log_message("info", message, logger="conformance-fixture-server",
                                         related_request_id=c.request_id)

    # ---- tools ----

    async def list_tools(_req: types.ListToolsRequest) -> types.ServerResult:
        return types.ServerResult(types.ListToolsResult(
            tools=[types.Tool(name=n, description=d, inputSchema=s,
                              execution=types.ToolExecution(taskSupport=TASK_SUPPORT[n]) if n in TASK_SUPPORT else None)
                   for n, d, s in TOOLS]))

    async def call_tool(req: types.CallToolRequest) -> types.ServerResult:
        name = req.params.name
        args = req.params.arguments or {}
        c = rctx()
        session: ServerSession = c.session
        token = c.meta.progressToken if c.meta else None
        log(f"[{tag(session)}] tools/call {name} id={c.request_id!r}")
        try:
            return await call_tool_inner(name, args, session, token)
        except BaseException as e:
            log(f"[{tag(session)}] tools/call {name} id={c.request_id!r} ended by {type(e).__name__}: {e}")
            raise

    async def call_tool_inner(name: str, args: dict[str, Any], session: ServerSession, token: Any) -> types.ServerResult:

        if name == "test_simple_text":
            return result(text("This is a simple text response for testing."))
        if name == "test_image_content":
            return result(types.ImageContent(type="image", data=IMAGE, mimeType="image/png"))
        if name == "test_audio_content":
            return result(types.AudioContent(type="audio", data=AUDIO, mimeType="audio/wav"))
        if name == "test_embedded_resource":
            return result(types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                uri="test://embedded-resource", mimeType="text/plain", text="This is an embedded resource content.")))
        if name == "test_multiple_content_types":
            return result(
                text("Multiple content types test:"),
                types.ImageContent(type="image", data=IMAGE, mimeType="image/png"),
                types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                    uri="test://mixed-content-resource", mimeType="application/json",
                    text=json.dumps({"test": "data", "value": 123}, separators=(",", ":")))),
            )
        if name == "test_tool_with_logging":
            await info("Tool execution started")
            await anyio.sleep(0.05)
            await info("Tool processing data")
            await anyio.sleep(0.05)
            await info("Tool execution completed")
            return result(text("Tool with logging executed successfully"))
        if name == "test_tool_with_progress":
            for i, p in enumerate((0, 50, 100)):
                if i:
                    await anyio.sleep(0.05)
                await progress(token, p, 100, f"Completed step {p} of 100")
            return result(text(str(token if token is not None else 0)))
        if name == "test_error_handling":
            return result(text("This tool intentionally returns an error for testing"), is_error=True)
        if name == "test_reconnection":
            await anyio.sleep(0.1)
            return result(text("Reconnection test completed successfully."))
        if name == "test_sampling":
            try:
                r = await ask(session, "sampling", "sampling/createMessage",
                              sampling_params(str(args.get("prompt", "")), 100))
                return result(text(f"LLM response: {sample_text(r)}"))
            except McpError as e:
                return result(text(f"Sampling not supported or error: {e.error.message}"))
        if name in ("test_elicitation", "test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums"):
            if name == "test_elicitation":
                params = elicit_params(str(args.get("message", "")),
                                       {"response": {"type": "string", "description": "User's response"}},
                                       ["response"])
                prefix = "User response"
            elif name == "test_elicitation_sep1034_defaults":
                params = elicit_params("Please review and update the form fields with defaults", {
                    "name": {"type": "string", "description": "User name", "default": "John Doe"},
                    "age": {"type": "integer", "description": "User age", "default": 30},
                    "score": {"type": "number", "description": "User score", "default": 95.5},
                    "status": {"type": "string", "description": "User status",
                               "enum": ["active", "inactive", "pending"], "default": "active"},
                    "verified": {"type": "boolean", "description": "Verification status", "default": True},
                }, [])
                prefix = "Elicitation completed"
            else:
                params = elicit_params("Please select options from the enum fields", {
                    "untitledSingle": {"type": "string", "description": "Select one option",
                                       "enum": ["option1", "option2", "option3"]},
                    "titledSingle": {"type": "string", "description": "Select one option with titles",
                                     "oneOf": [{"const": "value1", "title": "First Option"},
                                               {"const": "value2", "title": "Second Option"},
                                               {"const": "value3", "title": "Third Option"}]},
                    "legacyEnum": {"type": "string", "description": "Select one option (legacy)",
                                   "enum": ["opt1", "opt2", "opt3"],
                                   "enumNames": ["Option One", "Option Two", "Option Three"]},
                    "untitledMulti": {"type": "array", "description": "Select multiple options", "minItems": 1,
                                      "maxItems": 3, "items": {"type": "string",
                                                               "enum": ["option1", "option2", "option3"]}},
                    "titledMulti": {"type": "array", "description": "Select multiple options with titles",
                                    "minItems": 1, "maxItems": 3,
                                    "items": {"anyOf": [{"const": "value1", "title": "First Choice"},
                                                        {"const": "value2", "title": "Second Choice"},
                                                        {"const": "value3", "title": "Third Choice"}]}},
                }, [])
                prefix = "Elicitation completed"
            try:
                r = await ask(session, "elicitation", "elicitation/create", params)
                return result(text(f"{prefix}: action={r.get('action')}, "
                                   f"content={json.dumps(r.get('content') or {}, separators=(',', ':'))}"))
            except McpError as e:
                return result(text(f"Elicitation not supported or error: {e.error.message}"))
        if name == "json_schema_2020_12_tool":
            return result(text(f"JSON Schema 2020-12 tool called with: {json.dumps(args, separators=(',', ':'))}"))
        if name == "test_custom_headers":
            return result(text(f"custom headers: {json.dumps(args, separators=(',', ':'))}"))

        # server-stateless diagnostics
        if name == "test_missing_capability":
            # Asks whatever the client declared: an undeclared sampling capability is the proxy's to
            # refuse (-32021, HTTP 400).
            r = await ask(session, "sampling", "sampling/createMessage", sampling_params("Say something", 20))
            return result(text(f"Success: {sample_text(r)}"))
        if name == "test_streaming_elicitation":
            await progress(token, 50, 100, "halfway")
            return result(text("Streaming complete"))
        if name == "test_logging_tool":
            await info("Diagnostic trace logging activated")
            return result(text("Logging evaluated"))
        if name == "test_trigger_tool_change":
            n = await broadcast(types.ServerNotification(types.ToolListChangedNotification(
                method="notifications/tools/list_changed")))
            log(f"tools/list_changed sent to {n} session(s)")
            return result(text("Mutation triggered"))
        if name == "test_trigger_prompt_change":
            n = await broadcast(types.ServerNotification(types.PromptListChangedNotification(
                method="notifications/prompts/list_changed")))
            log(f"prompts/list_changed sent to {n} session(s)")
            return result(text("Mutation triggered"))

        # MRTR
        if name == "test_input_required_result_elicitation":
            r = await ask(session, "user_name", "elicitation/create",
                          elicit_params("What is your name?", {"name": STR}, ["name"]))
            return result(text(f"Hello, {content_field(r, 'name')}!"))
        if name == "test_input_required_result_sampling":
            r = await ask(session, "capital_question", "sampling/createMessage",
                          sampling_params("What is the capital of France?", 100))
            return result(text(f"Sampling result: {sample_text(r)}"))
        if name == "test_input_required_result_list_roots":
            r = await ask(session, "client_roots", "roots/list", {})
            roots = r.get("roots") if isinstance(r.get("roots"), list) else []
            return result(text(f"Found {len(roots)} root(s)"))
        if name in ("test_input_required_result_request_state", "test_input_required_result_tampered_state"):
            r = await ask(session, "confirm", "elicitation/create",
                          elicit_params("Please confirm", {"ok": {"type": "boolean"}}, ["ok"]))
            ok = r.get("action") == "accept" and content_field(r, "ok", None) is True
            if name == "test_input_required_result_request_state":
                return result(text("state-ok: requestState validated" if ok else f"not confirmed: {r.get('action')}"))
            return result(text("integrity-ok: state verified"))
        if name == "test_input_required_result_multiple_inputs":
            got: dict[str, dict[str, Any]] = {}

            async def one(key: str, method: str, params: dict[str, Any]) -> None:
                got[key] = await ask(session, key, method, params)

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, "user_name", "elicitation/create",
                              elicit_params("What is your name?", {"name": STR}, ["name"]))
                tg.start_soon(one, "greeting", "sampling/createMessage", sampling_params("Generate a greeting", 50))
                tg.start_soon(one, "client_roots", "roots/list", {})
            roots = got["client_roots"].get("roots")
            n_roots = len(roots) if isinstance(roots, list) else 0
            return result(text(f"Name: {content_field(got['user_name'], 'name')}; "
                               f"Greeting: {sample_text(got['greeting'], 'Hello there!')}; Roots: {n_roots}"))
        if name == "test_input_required_result_multi_round":
            r1 = await ask(session, "step1", "elicitation/create",
                           elicit_params("Step 1: What is your name?", {"name": STR}, ["name"]))
            r2 = await ask(session, "step2", "elicitation/create",
                           elicit_params("Step 2: What is your favorite color?", {"color": STR}, ["color"]))
            return result(text(f"Multi-round complete for {content_field(r1, 'name', 'friend')} "
                               f"who likes {content_field(r2, 'color')}"))
        if name == "test_input_required_result_capabilities":
            caps = session.client_params.capabilities if session.client_params else types.ClientCapabilities()
            wanted: list[tuple[str, str, dict[str, Any]]] = []
            if caps.elicitation is not None:
                wanted.append(("elicit_input", "elicitation/create",
                               elicit_params("Elicitation input", {"value": STR}, ["value"])))
            if caps.sampling is not None:
                wanted.append(("sample_input", "sampling/createMessage", sampling_params("Sample request", 50)))
            if not wanted:
                return result(text("No supported capabilities declared"))
            received: list[str] = []

            async def one_cap(key: str, method: str, params: dict[str, Any]) -> None:
                await ask(session, key, method, params)
                received.append(key)

            async with anyio.create_task_group() as tg:
                for w in wanted:
                    tg.start_soon(one_cap, *w)
            return result(text(f"capabilities-ok: received {','.join(sorted(received))}"))

        # tasks
        if name == "greet":
            return result(text(f"Hello, {args.get('name', 'World')}!"))
        if name == "slow_compute":
            seconds = float(args.get("seconds", 1) or 0)
            label = args.get("label", "")
            await anyio.sleep(seconds)
            return result(text(f"slow_compute {label} done after {seconds:g}s"))
        if name == "failing_job":
            await anyio.sleep(1)
            return result(text("failing_job: the job failed"), is_error=True)
        if name == "protocol_error_job":
            await anyio.sleep(1)
            raise McpError(types.ErrorData(code=types.INTERNAL_ERROR, message="protocol_error_job: internal failure"))
        if name == "confirm_delete":
            filename = args.get("filename", "")
            await anyio.sleep(0.8)
            r = await ask(session, "confirm", "elicitation/create",
                          elicit_params(f"Delete {filename}?", {"confirm": {"type": "boolean"}}, ["confirm"]))
            if r.get("action") == "accept":
                return result(text(f"Deleted {filename}"))
            return result(text(f"Kept {filename} ({r.get('action')})"))
        if name == "multi_input":
            await anyio.sleep(0.8)
            answers: dict[str, dict[str, Any]] = {}

            async def one_in(key: str, message: str) -> None:
                answers[key] = await ask(session, key, "elicitation/create",
                                         elicit_params(message, {"value": STR}, ["value"]))

            async with anyio.create_task_group() as tg:
                tg.start_soon(one_in, "first", "First value?")
                tg.start_soon(one_in, "second", "Second value?")
            return result(text(f"multi_input: first={content_field(answers['first'], 'value')}, "
                               f"second={content_field(answers['second'], 'value')}"))
        if name == "test_tool_with_task":
            r = await ask(session, "user_name", "elicitation/create",
                          elicit_params("What is your name?", {"name": STR}, ["name"]))
            await anyio.sleep(1.5)
            return result(text(f"Hello, {content_field(r, 'name')}! (from a task)"))

        raise McpError(types.ErrorData(code=types.INVALID_PARAMS, message=f"Unknown tool: {name}"))

    # ---- resources ----

    async def list_resources(_req: types.ListResourcesRequest) -> types.ServerResult:
        return types.ServerResult(types.ListResourcesResult(resources=RESOURCES))

    async def list_templates(_req: types.ListResourceTemplatesRequest) -> types.ServerResult:
        return types.ServerResult(types.ListResourceTemplatesResult(resourceTemplates=TEMPLATES))

    async def read_resource(req: types.ReadResourceRequest) -> types.ServerResult:
        uri = str(req.params.uri)
        contents: list[types.TextResourceContents | types.BlobResourceContents]
        if uri == "test://static-text":
            contents = [types.TextResourceContents(uri=uri, mimeType="text/plain",
                                                   text="This is the content of the static text resource.")]
        elif uri == "test://static-binary":
            contents = [types.BlobResourceContents(uri=uri, mimeType="image/png", blob=IMAGE)]
        elif uri == "test://watched-resource":
            contents = [types.TextResourceContents(uri=uri, mimeType="text/plain", text="Watched resource content")]
        elif uri.startswith("test://template/") and uri.endswith("/data") and len(uri) > len("test://template//data"):
            id_ = uri[len("test://template/"):-len("/data")]
            contents = [types.TextResourceContents(uri=uri, mimeType="application/json", text=json.dumps(
                {"id": id_, "templateTest": True, "data": f"Data for ID: {id_}"}, separators=(",", ":")))]
        else:
            raise McpError(types.ErrorData(code=types.INVALID_PARAMS, message="Resource not found", data={"uri": uri}))
        return types.ServerResult(types.ReadResourceResult(contents=contents))

    async def subscribe(req: types.SubscribeRequest) -> types.ServerResult:
        subscriptions.add(str(req.params.uri))
        return types.ServerResult(types.EmptyResult())

    async def unsubscribe(req: types.UnsubscribeRequest) -> types.ServerResult:
        subscriptions.discard(str(req.params.uri))
        return types.ServerResult(types.EmptyResult())

    # ---- prompts ----

    async def list_prompts(_req: types.ListPromptsRequest) -> types.ServerResult:
        return types.ServerResult(types.ListPromptsResult(prompts=PROMPTS))

    async def get_prompt(req: types.GetPromptRequest) -> types.ServerResult:
        name = req.params.name
        a = req.params.arguments or {}

        def msg(content: Any) -> types.PromptMessage:
            return types.PromptMessage(role="user", content=content)

        if name == "test_simple_prompt":
            messages = [msg(text("This is a simple prompt for testing."))]
        elif name == "test_prompt_with_arguments":
            messages = [msg(text(f"Prompt with arguments: arg1='{a.get('arg1', '')}', arg2='{a.get('arg2', '')}'"))]
        elif name == "test_prompt_with_embedded_resource":
            messages = [
                msg(types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                    uri=a.get("resourceUri", "test://example-resource"), mimeType="text/plain",
                    text="Embedded resource content for testing."))),
                msg(text("Please process the embedded resource above.")),
            ]
        elif name == "test_prompt_with_image":
            messages = [msg(types.ImageContent(type="image", data=IMAGE, mimeType="image/png")),
                        msg(text("Please analyze the image above."))]
        elif name == "test_input_required_result_prompt":
            r = await ask(rctx().session, "user_context", "elicitation/create",
                          elicit_params("What context should the prompt use?", {"context": STR}, ["context"]))
            messages = [msg(text(f"Prompt with context: {content_field(r, 'context')}"))]
        else:
            raise McpError(types.ErrorData(code=types.INVALID_PARAMS, message=f"Unknown prompt: {name}"))
        return types.ServerResult(types.GetPromptResult(messages=messages))

    # ---- logging, completion ----

    async def set_level(req: types.SetLevelRequest) -> types.ServerResult:
        log(f"log level set to {req.params.level}")
        return types.ServerResult(types.EmptyResult())

    async def complete(req: types.CompleteRequest) -> types.ServerResult:
        value = req.params.argument.value
        pool = ["paris", "park", "party"] if req.params.argument.name == "arg1" else []
        values = [v for v in pool if v.startswith(value)]
        return types.ServerResult(types.CompleteResult(
            completion=types.Completion(values=values, total=len(values), hasMore=False)))

    server.request_handlers.update({
        types.ListToolsRequest: list_tools,
        types.CallToolRequest: call_tool,
        types.ListResourcesRequest: list_resources,
        types.ListResourceTemplatesRequest: list_templates,
        types.ReadResourceRequest: read_resource,
        types.SubscribeRequest: subscribe,
        types.UnsubscribeRequest: unsubscribe,
        types.ListPromptsRequest: list_prompts,
        types.GetPromptRequest: get_prompt,
        types.SetLevelRequest: set_level,
        types.CompleteRequest: complete,
    })
    init = InitializationOptions(
        server_name="mcp-conformance-fixture-server",
        server_version="1.0.0",
        capabilities=types.ServerCapabilities(
            tools=types.ToolsCapability(listChanged=True),
            resources=types.ResourcesCapability(subscribe=True, listChanged=True),
            prompts=types.PromptsCapability(listChanged=True),
            logging=types.LoggingCapability(),
            completions=types.CompletionsCapability(),
        ),
    )
    return server, init


def sse_app(server: lowlevel.Server, init: InitializationOptions) -> Starlette:
    # As FastMCP's sse_app for a 127.0.0.1 host: DNS rebinding protection on, loopback allowed.
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )
    sse = SseServerTransport("/messages/", security_settings=security)

    async def handle_sse(request: Request) -> Response:
        async with sse.connect_sse(request.scope, request.receive, request._send) as streams:  # noqa: SLF001
            try:
                await server.run(streams[0], streams[1], init)
            except BaseException as e:
                log(f"a session ended by {type(e).__name__}: {e!r}")
                raise
        log(f"an SSE stream ended (sessions open: {len(SESSIONS)})")
        return Response()

    return Starlette(routes=[Route("/sse", endpoint=handle_sse, methods=["GET"]),
                             Mount("/messages/", app=sse.handle_post_message)])


# uvicorn's default config sends the access log to stdout; keep stdout for JSON only.
LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stderr"}},
    "loggers": {
        "uvicorn": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        "uvicorn.error": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        "uvicorn.access": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
    },
}


async def serve(port: int, lifetime: float, orphan_exit: bool) -> int:
    server, init = build()
    config = uvicorn.Config(sse_app(server, init), host="127.0.0.1", port=port, log_level="info",
                            log_config=LOG_CONFIG, timeout_graceful_shutdown=2)
    userver = uvicorn.Server(config)
    parent = os.getppid()
    status = {"code": 0}

    async def watch() -> None:
        start = anyio.current_time()
        announced = False
        while True:
            await anyio.sleep(0.05 if not announced else 0.5)
            if not announced and userver.started:
                print(json.dumps({"ready": True, "port": port, "pid": os.getpid(),
                                  "sse_url": f"http://127.0.0.1:{port}/sse"}), flush=True)
                announced = True
            if lifetime > 0 and anyio.current_time() - start > lifetime:
                log(f"lifetime of {lifetime:g} s expired, shutting down")
                status["code"] = 124
                userver.should_exit = True
                return
            if orphan_exit and os.getppid() != parent:
                log("parent process died, shutting down")
                status["code"] = 125
                userver.should_exit = True
                return
            if userver.should_exit:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        try:
            await userver.serve()
        except SystemExit as e:  # uvicorn: sys.exit(STARTUP_FAILURE) when the port cannot be bound
            log(f"uvicorn startup failed (SystemExit {e.code})")
            status["code"] = 1
        tg.cancel_scope.cancel()
    if status["code"] == 0 and not userver.started:
        log("server stopped before it started")
        return 1
    return status["code"]


def main() -> int:
    ap = argparse.ArgumentParser(prog=PROG, description="legacy SSE fixture server for the MCP conformance suite")
    ap.add_argument("port", type=int)
    ap.add_argument("--lifetime", type=float, default=float(os.environ.get("PEER_LIFETIME_S", "600")),
                    help="exit (124) after this many seconds; 0 = unlimited (env PEER_LIFETIME_S, default 600)")
    args = ap.parse_args()
    if not 0 < args.port < 65536:
        ap.error("port out of range")
    orphan_exit = os.environ.get("PEER_ORPHAN_EXIT", "1") != "0"
    import logging

    # The SDK logs a message it cannot take only at debug level, right after its warning: keep that
    # one on stderr (with the warnings), not the rest of its debug log.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler.addFilter(lambda r: r.levelno >= logging.WARNING
                      or r.getMessage().startswith("Message that failed validation"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.DEBUG)
    try:
        return anyio.run(serve, args.port, args.lifetime, orphan_exit)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
