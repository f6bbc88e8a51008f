"""``mcp.json``: which MCP servers Hearth runs, and which of their tools the model may see.

The file is the ``mcpServers`` format that LM Studio, Cursor and Claude Desktop use, so a person can paste an
entry from a server's README unchanged::

The reasoning: docs/mcp.md, 'app/mcp/config.py'.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from app import paths
from app.errors import InvalidRequest
from app.fileio import JsonFileError, atomic_write_text, read_json_file, set_aside

log = logging.getLogger(__name__)

CONFIG_FILENAME = "mcp.json"
_WHAT_TO_DO = "fix or delete the file; until then Hearth starts no MCP servers"
# Keys read into fields; every other key (``type`` included, which is only checked) is kept in ``extra``.
_KNOWN_KEYS = {"command", "args", "env", "cwd", "url", "headers", "disabled", "disabledTools", "alwaysAllow"}
_STDIO_TYPES = {"stdio"}
_HTTP_TYPES = {"http", "streamable-http", "streamable_http", "streamableHttp"}


class McpConfigError(InvalidRequest):
    """``mcp.json`` is malformed. ``param``: the field as a path, e.g. ``mcpServers.fs.command`` (None when the
    file is not JSON at all); ``path``: the file (None for a config built in memory)."""

    def __init__(self, message: str, param: str | None = None, path: str | None = None) -> None:
        super().__init__(message, param=param)
        self.path = path

    def __reduce__(self):
        return (self.__class__, (self.message, self.param, self.path))


@dataclass(frozen=True)
class McpServerConfig:
    """One entry of ``mcpServers``. ``transport``: ``"stdio"`` (``command``, ``args``, ``env``, ``cwd``) or
    ``"http"`` (streamable HTTP: ``url``, ``headers``). ``disabled_tools`` / ``always_allow``: MCP tool names as
    the server lists them (not Hearth's qualified names). ``extra``: keys Hearth does not read, kept on save."""

    name: str
    transport: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    disabled: bool = False
    disabled_tools: frozenset[str] = frozenset()
    always_allow: frozenset[str] = frozenset()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:  # read-only views: a frozen value must not change through its dicts
        for name in ("env", "headers", "extra"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "disabled_tools", frozenset(self.disabled_tools))
        object.__setattr__(self, "always_allow", frozenset(self.always_allow))

    def tool_enabled(self, tool: str) -> bool:
        """Whether the model may see MCP tool ``tool`` of this server (the Settings switch)."""
        return tool not in self.disabled_tools

    def launch_key(self) -> tuple:
        """What a running server depends on: when it changes, the server must be restarted (a changed switch
        does not need one)."""
        return (self.transport, self.command, self.args, tuple(sorted(self.env.items())), self.cwd, self.url,
                tuple(sorted(self.headers.items())))

    def to_json(self) -> dict[str, Any]:
        """The entry as it is written in ``mcp.json`` (unknown keys first, as they were read)."""
        out: dict[str, Any] = dict(self.extra)
        if self.transport == "stdio":
            out["command"] = self.command
            if self.args:
                out["args"] = list(self.args)
            if self.env:
                out["env"] = dict(self.env)
            if self.cwd:
                out["cwd"] = self.cwd
        else:
            out["url"] = self.url
            if self.headers:
                out["headers"] = dict(self.headers)
        if self.disabled:
            out["disabled"] = True
        if self.disabled_tools:
            out["disabledTools"] = sorted(self.disabled_tools)
        if self.always_allow:
            out["alwaysAllow"] = sorted(self.always_allow)
        return out


@dataclass(frozen=True)
class McpConfig:
    """All configured servers, in file order. ``extra``: top-level keys other than ``mcpServers``, kept."""

    servers: tuple[McpServerConfig, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "servers", tuple(self.servers))
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))
        names = [s.name for s in self.servers]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise McpConfigError(f"two servers are named {dup!r}", param=f"mcpServers.{dup}")

    def server(self, name: str) -> McpServerConfig:
        """The entry named ``name``; ``KeyError`` when there is none."""
        for s in self.servers:
            if s.name == name:
                return s
        raise KeyError(name)

    def names(self) -> list[str]:
        """Server names in file order."""
        return [s.name for s in self.servers]

    def with_server(self, server: McpServerConfig) -> McpConfig:
        """A copy with ``server`` added, or replacing the entry of the same name in place."""
        names = self.names()
        if server.name in names:
            servers = tuple(server if s.name == server.name else s for s in self.servers)
        else:
            servers = (*self.servers, server)
        return replace(self, servers=servers)

    def without_server(self, name: str) -> McpConfig:
        """A copy without the entry ``name`` (unchanged when there is none)."""
        return replace(self, servers=tuple(s for s in self.servers if s.name != name))

    def with_tool_enabled(self, server: str, tool: str, enabled: bool) -> McpConfig:
        """A copy where MCP tool ``tool`` of ``server`` is switched on or off; ``KeyError`` for an unknown
        server."""
        s = self.server(server)
        off = s.disabled_tools - {tool} if enabled else s.disabled_tools | {tool}
        return self.with_server(replace(s, disabled_tools=frozenset(off)))

    def with_always_allow(self, server: str, tool: str, allow: bool = True) -> McpConfig:
        """A copy where ``tool`` of ``server`` is (or no longer is) allowed without asking."""
        s = self.server(server)
        allowed = s.always_allow | {tool} if allow else s.always_allow - {tool}
        return self.with_server(replace(s, always_allow=frozenset(allowed)))

    def to_json(self) -> dict[str, Any]:
        """The whole file as a JSON-ready dict."""
        return {**self.extra, "mcpServers": {s.name: s.to_json() for s in self.servers}}


def config_path() -> Path:
    """``mcp.json`` in the data folder (``app.paths.home()``; the file may not exist yet)."""
    return paths.home() / CONFIG_FILENAME


def load_config(path: str | os.PathLike[str] | None = None) -> McpConfig:
    """Read and validate ``mcp.json`` (default: ``config_path()``). A missing file is an empty config.

    Raises ``McpConfigError`` naming the file, what is wrong and what to do: the file is damaged
    (``app.fileio.read_json_file``: not UTF-8, cut short, nested deeper than 64 levels, a lone surrogate,
    empty, not an object; then ``param`` is None, or ``"(root)"`` for the last) or an entry is malformed
    (``param`` names the field); ``OSError`` when it exists but cannot be read. Never writes the file."""
    p = Path(path) if path is not None else config_path()
    try:
        data = read_json_file(p, object_only=False)
    except FileNotFoundError:
        return McpConfig()
    except JsonFileError as e:
        raise McpConfigError(f"{e}; {_WHAT_TO_DO}", path=str(p)) from None
    try:
        return parse_config(data)
    except McpConfigError as e:
        raise McpConfigError(f"{p}: {e.message}; {_WHAT_TO_DO}", param=e.param, path=str(p)) from None


def save_config(path: str | os.PathLike[str] | None, cfg: McpConfig) -> None:
    """Write ``cfg`` to ``path`` (default: ``config_path()``) atomically, pretty-printed; the folder is created.
    A file there that ``load_config`` refuses is never written over: it is first renamed to
    ``mcp.json.corrupt-<UTC time>`` (logged as a warning). Raises ``OSError`` when the write (or that rename)
    fails, and then the old file is unchanged."""
    p = Path(path) if path is not None else config_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        load_config(p)
    except McpConfigError as e:
        aside = set_aside(p)
        log.warning("%s; it was kept as %s, and a new %s is written", e.message.removesuffix(f"; {_WHAT_TO_DO}"),
                    aside, p.name)
    except OSError:
        pass  # unreadable: the write below says why if it fails
    atomic_write_text(p, json.dumps(cfg.to_json(), indent=2, ensure_ascii=False) + "\n")


def parse_config(data: Any) -> McpConfig:
    """Validate the decoded JSON of ``mcp.json``; raises ``McpConfigError`` naming the first bad field."""
    if not isinstance(data, dict):
        raise McpConfigError(f"the file must hold a JSON object, got {_kind(data)}", param="(root)")
    servers = data.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise McpConfigError(f"mcpServers must be an object of server entries, got {_kind(servers)}",
                             param="mcpServers")
    parsed = tuple(parse_server(name, entry) for name, entry in servers.items())
    return McpConfig(servers=parsed, extra={k: v for k, v in data.items() if k != "mcpServers"})


def parse_server(name: str, entry: Any) -> McpServerConfig:
    """Validate one ``mcpServers`` entry; raises ``McpConfigError`` with ``param`` ``mcpServers.<name>.<field>``."""
    where = f"mcpServers.{name}"
    if not name.strip():
        raise McpConfigError("a server name must not be empty", param=where)
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where} must be an object, got {_kind(entry)}", param=where)
    transport = _transport(entry, where)
    common = dict(
        name=name, transport=transport,
        disabled=_bool(entry, "disabled", where),
        disabled_tools=frozenset(_str_list(entry, "disabledTools", where)),
        always_allow=frozenset(_str_list(entry, "alwaysAllow", where)),
        extra={k: v for k, v in entry.items() if k not in _KNOWN_KEYS},
    )
    unused = [k for k in common["extra"] if k != "type"]
    if unused:
        log.info("mcp.json: %s: keys Hearth does not use (kept): %s", where, ", ".join(unused))
    if transport == "stdio":
        command = entry.get("command")
        if not isinstance(command, str) or not command.strip():
            raise McpConfigError(f"{where}.command must be a non-empty string (the program to run), got "
                                 f"{command!r}", param=f"{where}.command")
        cwd = entry.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise McpConfigError(f"{where}.cwd must be a string (a folder), got {_kind(cwd)}", param=f"{where}.cwd")
        return McpServerConfig(command=command, args=tuple(_str_list(entry, "args", where)),
                               env=_str_map(entry, "env", where), cwd=cwd or None, **common)
    url = entry.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise McpConfigError(f"{where}.url must be an http:// or https:// URL, got {url!r}", param=f"{where}.url")
    return McpServerConfig(url=url, headers=_str_map(entry, "headers", where), **common)


def _transport(entry: dict[str, Any], where: str) -> str:
    has_cmd, has_url = "command" in entry, "url" in entry
    kind = entry.get("type")
    if kind is not None and kind not in _STDIO_TYPES | _HTTP_TYPES:
        hint = " (Hearth speaks streamable HTTP; most servers serve it at /mcp)" if kind == "sse" else ""
        raise McpConfigError(f"{where}.type {kind!r} is not supported: use 'stdio' or 'http'{hint}",
                             param=f"{where}.type")
    if has_cmd and has_url:
        raise McpConfigError(f"{where} has both command and url: give one (command for a local program, url "
                             "for an HTTP server)", param=f"{where}.url")
    if not has_cmd and not has_url:
        raise McpConfigError(f"{where} needs a command (a local program) or a url (an HTTP server)",
                             param=f"{where}.command")
    transport = "stdio" if has_cmd else "http"
    if kind is not None and (kind in _STDIO_TYPES) != (transport == "stdio"):
        raise McpConfigError(f"{where}.type is {kind!r} but the entry has a {'command' if has_cmd else 'url'}",
                             param=f"{where}.type")
    return transport


def _bool(entry: dict[str, Any], key: str, where: str) -> bool:
    v = entry.get(key, False)
    if not isinstance(v, bool):
        raise McpConfigError(f"{where}.{key} must be true or false, got {v!r}", param=f"{where}.{key}")
    return v


def _str_list(entry: dict[str, Any], key: str, where: str) -> list[str]:
    v = entry.get(key, [])
    if not isinstance(v, list):
        raise McpConfigError(f"{where}.{key} must be a list of strings, got {_kind(v)}", param=f"{where}.{key}")
    for i, item in enumerate(v):
        if not isinstance(item, str):
            raise McpConfigError(f"{where}.{key}[{i}] must be a string, got {_kind(item)} {item!r}",
                                 param=f"{where}.{key}[{i}]")
    return list(v)


def _str_map(entry: dict[str, Any], key: str, where: str) -> dict[str, str]:
    v = entry.get(key, {})
    if not isinstance(v, dict):
        raise McpConfigError(f"{where}.{key} must be an object of strings, got {_kind(v)}", param=f"{where}.{key}")
    for k, item in v.items():
        if not isinstance(item, str):
            raise McpConfigError(f"{where}.{key}.{k} must be a string, got {_kind(item)} {item!r}",
                                 param=f"{where}.{key}.{k}")
    return dict(v)


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number" if isinstance(v, (int, float)) else type(v).__name__)
