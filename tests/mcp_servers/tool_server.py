"""A small MCP server for the tests, written with the official SDK (``mcp.server.mcpserver.MCPServer``, the
FastMCP of mcp 1.x).

    python tool_server.py [--marker=...]   # stdio (the marker only tags the process for the tests)
    python tool_server.py http PORT        # streamable HTTP on http://127.0.0.1:PORT/mcp

Tools: ``add``, ``echo``, ``big`` (a result of exactly ``n_bytes`` bytes), ``slow`` (sleeps), ``fail`` (raises:
an ``isError`` result), ``crash`` (the process exits mid-call, as a crashing server does), ``header`` (an HTTP
request header, to check the configured ``headers`` arrive), ``grow`` (adds a tool and sends
``notifications/tools/list_changed``).
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("hearth-test", version="1.0", instructions="Tools for Hearth's MCP client tests.",
                   log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def big(n_bytes: int) -> str:
    """Return a text of exactly n_bytes ASCII bytes."""
    return "x" * n_bytes


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep for the given number of seconds, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}s"


@server.tool()
def fail() -> str:
    """Always raise: the client receives an isError result."""
    raise ToolError("this tool always fails")


@server.tool()
def crash() -> str:
    """End the server process in the middle of the call."""
    os._exit(3)


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The value of HTTP request header ``name`` ('' when absent or on stdio)."""
    return (ctx.headers or {}).get(name.lower(), "")


@server.tool()
async def grow(ctx: Context) -> str:
    """Add a tool named ``extra`` and tell the client its tool list changed."""

    def extra() -> str:
        """A tool added at run time."""
        return "extra"

    server.add_tool(extra)
    await ctx.session.send_tool_list_changed()
    return "grown"


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
