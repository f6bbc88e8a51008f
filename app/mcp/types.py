"""The MCP client's values: ``McpTool``, ``ServerStatus``, ``ToolResult``, ``ToolError``, and the two pure
functions that shape what the model sees (``content_to_text``, ``qualified_names`` with ``name_clashes``;
docs/mcp.md, 'McpHub')."""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from app.errors import HearthError

ServerState = Literal["stopped", "starting", "ready", "failed"]

DEFAULT_START_TIMEOUT_S = 30.0  # first run of an `npx -y` server downloads it
DEFAULT_CALL_TIMEOUT_S = 60.0
_NAME_MAX = 64  # OpenAI function names: ^[a-zA-Z0-9_-]{1,64}$
_PREFIX_MAX = 24
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_RUNS = re.compile(r"__+")
SEPARATOR = "__"  # between a server's prefix and a tool's name


class ToolError(HearthError):
    """An MCP server cannot run a tool call. ``server``: its name in ``mcp.json``; ``tool``: the MCP tool name
    (None when the call never got that far); ``kind``: ``"unavailable"`` (the server is not ready: not started,
    failed to start, stopped, crashed earlier; the reason says which), ``"timeout"`` (the call ran past its
    ``timeout_s``), ``"crashed"`` (the connection was lost during this call; the server is now ``failed``),
    ``"failed"`` (this call's HTTP request failed, the session lives on), ``"unknown_tool"`` (no enabled tool
    has that name); ``reason``: a short reason for a person.

    A tool that runs and reports failure is not a ``ToolError``: it is a ``ToolResult`` with ``is_error`` (MCP
    asks clients to show those to the model, which may correct itself)."""

    def __init__(self, server: str, reason: str, kind: str = "unavailable", tool: str | None = None) -> None:
        where = (f"MCP server {server!r}" if server else "MCP") + (f", tool {tool!r}" if tool else "")
        super().__init__(f"{where}: {reason}")
        self.server = server
        self.reason = reason
        self.kind = kind
        self.tool = tool

    def __reduce__(self):
        return (self.__class__, (self.server, self.reason, self.kind, self.tool))


@dataclass(frozen=True)
class McpTool:
    """One tool of one server. ``name``: the MCP tool name; ``qualified_name``: the name the model sees, unique
    over all servers and valid as an OpenAI function name (``^[a-zA-Z0-9_-]{1,64}$``: ``<server>__<tool>``
    sanitized, shortened with a hash when needed); ``input_schema``: the tool's JSON Schema (an object schema,
    MCP ``inputSchema``); ``annotations``: MCP hints (``readOnlyHint``, ``destructiveHint``...), possibly empty;
    ``enabled``: the Settings switch; ``always_allowed``: the person allowed it "always" (``alwaysAllow``)."""

    server: str
    name: str
    qualified_name: str
    description: str
    input_schema: dict[str, Any]
    title: str | None = None
    annotations: dict[str, Any] = field(default_factory=dict)
    enabled: bool = True
    always_allowed: bool = False

    def openai_tool(self) -> dict[str, Any]:
        """The tool as an OpenAI ``tools`` entry (``{"type": "function", "function": {...}}``)."""
        return {"type": "function", "function": {
            "name": self.qualified_name, "description": self.description,
            "parameters": copy.deepcopy(self.input_schema)}}


@dataclass(frozen=True)
class ServerStatus:
    """Where one server stands. ``state``: ``stopped`` (never started, stopped, or ``disabled``), ``starting``,
    ``ready``, ``failed`` (``error`` says why, for a person); ``tools``: every tool it listed, switched off ones
    included (for the Settings switches), empty unless ready; ``server_info``: name and version from its
    ``initialize`` answer; ``transport``: ``"stdio"`` or ``"http"``."""

    name: str
    state: ServerState
    error: str | None = None
    tools: tuple[McpTool, ...] = ()
    server_info: str | None = None
    transport: str = "stdio"
    disabled: bool = False


@dataclass(frozen=True)
class ToolResult:
    """A finished ``tools/call``. ``text``: every content block as text (see ``content_to_text``), never
    truncated; ``is_error``: the tool reported failure (MCP ``isError``; also set for a JSON-RPC error answer
    and a result that breaks the tool's output schema); ``raw``: the content blocks as MCP JSON dicts;
    ``structured``: MCP ``structuredContent`` or None; ``size_bytes``: UTF-8 bytes of ``text``;
    ``elapsed_s``: wall time of the call in seconds."""

    server: str
    tool: str
    text: str
    is_error: bool
    raw: list[dict[str, Any]]
    structured: dict[str, Any] | None = None
    size_bytes: int = 0
    elapsed_s: float = 0.0


def content_to_text(blocks: Sequence[Mapping[str, Any]], structured: Mapping[str, Any] | None = None) -> str:
    """MCP content blocks (``CallToolResult.content``, JSON dicts) as one text for the model, blocks joined by
    newlines: ``text`` as is; an embedded ``resource`` with text as ``[resource <uri>]`` then its text; images,
    audio and binary resources as a bracketed note with the MIME type and decoded size in bytes (the model
    cannot see them); ``resource_link`` as a note with its name and URI. With no blocks, ``structured``
    (``structuredContent``) as JSON."""
    parts = [_block_text(b) for b in blocks]
    if not parts and structured is not None:
        parts = [json.dumps(structured, ensure_ascii=False)]
    return "\n".join(parts)


def _block_text(b: Mapping[str, Any]) -> str:
    kind = b.get("type")
    if kind == "text":
        return str(b.get("text", ""))
    if kind in ("image", "audio"):
        return f"[{kind}: {b.get('mimeType', '?')}, {_b64_len(b.get('data', ''))} bytes, not shown to the model]"
    if kind == "resource":
        r = b.get("resource") or {}
        if "text" in r:
            return f"[resource {r.get('uri', '')}]\n{r['text']}"
        return (f"[resource {r.get('uri', '')}: {r.get('mimeType', 'binary')}, {_b64_len(r.get('blob', ''))} "
                "bytes, not shown to the model]")
    if kind == "resource_link":
        return f"[resource link: {b.get('name', '')} {b.get('uri', '')}]".replace("  ", " ")
    return f"[{kind} content, not shown to the model]"


def _b64_len(data: Any) -> int:
    try:
        return len(base64.b64decode(str(data), validate=False))
    except (binascii.Error, ValueError):
        return len(str(data)) * 3 // 4


def qualified_names(servers: Sequence[tuple[str, Sequence[str]]]) -> dict[tuple[str, str], str]:
    """Model-facing names for ``(server, [tool names])`` in config order: ``<prefix>__<tool>``, at most 64
    characters of ``[A-Za-z0-9_-]`` (every other character becomes ``_``). One name, one pair, by construction:
    a prefix never contains ``__`` nor ends in ``_`` (runs of ``_`` collapse, ends are trimmed), so the first
    ``__`` of a name always ends its prefix, and prefixes are unique. They are made unique from the config alone
    (a server going down never renames another's tools): a prefix already taken gets a stable hash of the
    server name. Within one server, a tool name that is too long or collides after sanitizing gets a stable
    hash suffix (docs/mcp.md, 'Names the model sees')."""
    out: dict[tuple[str, str], str] = {}
    used_prefix: set[str] = set()
    for server, tools in servers:
        prefix = _unique_prefix(server, used_prefix)
        used_prefix.add(prefix)
        used: set[str] = set()
        for tool in tools:
            name = f"{prefix}{SEPARATOR}{_UNSAFE.sub('_', tool)}"
            if len(name) > _NAME_MAX or name in used:
                name = f"{name[:_NAME_MAX - 9]}_{_hash8(server + '/' + tool)}"
            n = 2
            while name in used:  # a hash clash: never in practice, but names must be unique
                name = f"{name[:_NAME_MAX - 4]}_{n:03d}"
                n += 1
            used.add(name)
            out[(server, tool)] = name
    return out


def _unique_prefix(server: str, used: set[str]) -> str:
    base = _RUNS.sub("_", _UNSAFE.sub("_", server)).strip("_")[:_PREFIX_MAX].rstrip("_") or "mcp"
    prefix, n = base, 1
    while prefix in used:  # the base is never empty nor starts with "_", so the cut one is not empty either
        prefix = f"{base[:_PREFIX_MAX - 9].rstrip('_')}_{_hash8(server if n == 1 else f'{server}#{n}')}"
        n += 1
    return prefix


def name_clashes(names: Mapping[tuple[str, str], str]) -> dict[str, list[tuple[str, str]]]:
    """The names of ``names`` given to more than one ``(server, tool)`` pair, each with its pairs in order.
    ``qualified_names`` never makes one; the hub refuses the tools of any that still arises (it cannot know
    which one the model meant, and the person's "always allow" of one must never run the other)."""
    pairs: dict[str, list[tuple[str, str]]] = {}
    for pair, name in names.items():
        pairs.setdefault(name, []).append(pair)
    return {name: p for name, p in pairs.items() if len(p) > 1}


def clash_text(name: str, pairs: Sequence[tuple[str, str]]) -> str:
    """One line naming every tool and server a clashing ``name`` was given to, and what to do."""
    owners = " and ".join(f"tool {tool!r} of server {server!r}" for server, tool in pairs)
    return f"the tool name {name!r} would be given to {owners}; neither is offered (rename a server in mcp.json)"


def _hash8(s: str) -> str:
    return hashlib.sha1(s.encode("utf-8")).hexdigest()[:8]
