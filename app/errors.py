"""Hearth's known errors: a small hierarchy shared by every layer.

Known errors (bad input, a bad model file, a full queue) are ``HearthError`` subclasses; they are shown to the
person as one clear line (CLI), one dialog (UI) or OpenAI error JSON (server, mapped by *type*, never by message
text). Anything else is a bug and is logged with its traceback.

Every class is picklable (it crosses the engine process boundary): ``__reduce__`` rebuilds it from its
constructor arguments.
"""

from __future__ import annotations


class HearthError(Exception):
    """Base of all known Hearth errors. ``str(err)`` is the message for a person."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self):  # picklable across processes with constructor args
        return (self.__class__, (self.message,))


class ModelLoadError(HearthError):
    """A model file cannot be used: not a GGUF, truncated, malformed metadata, unsupported architecture,
    a projector file, or llama.cpp refused it. ``path`` names the file."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self):
        return (self.__class__, (self.message, self.path))


class ContextLengthExceeded(HearthError):
    """The prompt (plus room for the answer) does not fit the context window.

    ``prompt_tokens``: tokens in the prompt; ``n_ctx``: the context size in tokens; ``max_tokens``: tokens
    reserved for the answer (0 when none was reserved); ``tools_tokens``: of the prompt, the tokens the tool
    definitions take (0 without tools); ``param``: the request field to blame, "messages", or "tools" when
    the prompt would fit without the tools."""

    def __init__(self, prompt_tokens: int, n_ctx: int, max_tokens: int = 0, tools_tokens: int = 0,
                 param: str = "messages") -> None:
        msg = (
            f"prompt is {prompt_tokens} tokens but the context window (n_ctx) is {n_ctx} tokens"
            + (f" and {max_tokens} tokens are reserved for the answer (max_tokens)" if max_tokens else "")
            + (f"; the tool definitions take {tools_tokens} of them" if tools_tokens else "")
            + ("; send fewer or shorter tools" if param == "tools" else "")
            + "; shorten the prompt, lower max_tokens or raise n_ctx"
        )
        super().__init__(msg)
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        self.max_tokens = max_tokens
        self.tools_tokens = tools_tokens
        self.param = param

    def __reduce__(self):
        return (self.__class__, (self.prompt_tokens, self.n_ctx, self.max_tokens, self.tools_tokens, self.param))


class InvalidRequest(HearthError):
    """A request parameter is out of range or malformed. ``param`` names it (OpenAI's ``param`` field)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self):
        return (self.__class__, (self.message, self.param))


class ModelNotFound(HearthError):
    """A model id or path names no known model. ``available`` lists the valid ids."""

    def __init__(self, model: str, available: list[str] | None = None) -> None:
        avail = list(available or [])
        super().__init__(
            f"model {model!r} not found; available: {', '.join(avail) if avail else '(none)'}"
        )
        self.model = model
        self.available = avail

    def __reduce__(self):
        return (self.__class__, (self.model, self.available))


class EngineCrashed(HearthError):
    """The engine process died (llama.cpp aborted, or it was killed). It restarts on the next request."""


class Cancelled(HearthError):
    """A request was cancelled by its caller before it finished."""


class QueueFull(HearthError):
    """Too many requests are waiting for the engine. ``retry_after_s``: a hint in seconds."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self):
        return (self.__class__, (self.message, self.retry_after_s))


class StoreError(HearthError):
    """A database (conversations, documents, cache index) cannot be read or written."""


class IngestError(HearthError):
    """A document cannot be indexed. ``path``: the file; ``reason``: a short reason for a person."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self):
        return (self.__class__, (self.path, self.reason))
