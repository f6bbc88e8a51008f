"""Tools the model may call: MCP servers (``config``: ``mcp.json``; ``client``: ``McpHub``; ``types``: its
values; ``transport``: one server's connection).

Qt-free and independent of the server and the UI, which both drive it (docs/mcp.md).
"""

from app.mcp.client import McpHub
from app.mcp.config import (
    McpConfig,
    McpConfigError,
    McpServerConfig,
    config_path,
    load_config,
    parse_config,
    save_config,
)
from app.mcp.types import (
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_START_TIMEOUT_S,
    McpTool,
    ServerStatus,
    ToolError,
    ToolResult,
    content_to_text,
    qualified_names,
)

__all__ = [
    "DEFAULT_CALL_TIMEOUT_S", "DEFAULT_START_TIMEOUT_S", "McpConfig", "McpConfigError", "McpHub",
    "McpServerConfig", "McpTool", "ServerStatus", "ToolError", "ToolResult", "config_path", "content_to_text",
    "load_config", "parse_config", "qualified_names", "save_config",
]
