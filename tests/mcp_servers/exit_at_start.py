"""An MCP server that dies before the handshake, as a server with a missing API key or module does."""

import sys

print("exit_at_start: HEARTH_TEST_TOKEN is not set", file=sys.stderr, flush=True)
sys.exit(3)
