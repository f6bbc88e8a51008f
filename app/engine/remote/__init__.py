"""Remote engines: another OpenAI-compatible server (Hearth, llama-server, vLLM, OpenAI) behind the same
backend contract as the local engine (docs/remote.md). ``errors``: what a failed exchange raises; ``wire``:
request bodies, event lines and metrics, pure; ``http``: the connection and the slots; ``engine``: the engine."""

from app.engine.remote.engine import DEFAULT_N_CTX, RemoteEngine, RemoteGeneration
from app.engine.remote.errors import (
    RemoteAuthError,
    RemoteBadRequest,
    RemoteError,
    RemoteRateLimited,
    RemoteServerError,
    RemoteStreamError,
    RemoteTimeout,
    RemoteUnreachable,
)
from app.engine.remote.wire import (
    KINDS,
    TOOL_FORMAT,
    StreamState,
    approx_tokens,
    check_name,
    check_supported,
    error_message,
    normalize_url,
    request_body,
    retry_after,
    sse_data,
)

__all__ = [
    "DEFAULT_N_CTX", "KINDS", "TOOL_FORMAT", "RemoteAuthError", "RemoteBadRequest", "RemoteEngine", "RemoteError",
    "RemoteGeneration", "RemoteRateLimited", "RemoteServerError", "RemoteStreamError", "RemoteTimeout",
    "RemoteUnreachable", "StreamState", "approx_tokens", "check_name", "check_supported", "error_message",
    "normalize_url", "request_body", "retry_after", "sse_data",
]
