"""The backend contract: what callers use of a chat backend (a local ``Engine``, a ``RemoteEngine``, the test
fake). Structural (``typing.Protocol``): a backend implements it by having these members, nothing inherits.
``tests/test_backend_contract.py`` checks every backend against it; docs/engine.md "The backend contract".
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, Sequence

from app.protocol.tools import ToolCall, ToolSpec
from app.protocol.types import Delta, Done, GenerateRequest, LoadSettings


class BackendStream(Protocol):
    """One request's stream (``Generation``, ``RemoteGeneration``). Nothing runs until it is iterated.

    Iterating yields ``Delta`` events (answer text, token ids, logprobs, thinking) and one final ``Done``.
    Iterating raises ``QueueFull`` (refused: too many waiting), ``ContextLengthExceeded`` (the prompt leaves
    no room), ``Cancelled`` (``cancel`` was called), ``EngineCrashed`` (the backend died or the remote failed;
    the text said so far is kept by the caller) or ``InvalidRequest``."""

    def __iter__(self) -> Iterator[Delta | Done]: ...

    def __next__(self) -> Delta | Done: ...

    @property
    def done(self) -> Done | None:
        """The final event once the stream has ended, else None."""
        ...

    def result(self) -> Done:
        """Drain the stream; its ``Done`` (``text``: the whole answer). Raises what iterating raises."""
        ...

    def cancel(self) -> None:
        """Stop this request only (any thread): within one decode step, or before it starts."""
        ...

    def close(self) -> None:
        """Stop the request if it runs and release its slot (call it from ``finally``)."""
        ...

    def stop_thinking(self) -> bool:
        """End the request's thinking at its next token (any thread). True when it will; False when it
        cannot (finished, no thinking, the answer already began, or already asked)."""
        ...


class RenderedText(Protocol):
    """A prompt with the model's chat template applied (``app.engine.chat.templates.RenderedPrompt``)."""

    @property
    def text(self) -> str:
        """The prompt text; may hold control-token text (tokenize it with ``special=True``)."""
        ...

    @property
    def add_bos(self) -> bool:
        """Prepend the model's BOS token when tokenizing."""
        ...

    @property
    def name(self) -> str:
        """The template used ("remote" for a remote's best-effort rendering)."""
        ...


class ToolDialect(Protocol):
    """How the backend's model writes tool calls (``app.engine.chat.tool_formats.ToolFormat``): hand it to
    ``app.engine.chat.tool_stream.ToolStream`` to read an answer's calls."""

    @property
    def name(self) -> str:
        """The family's key in ``tool_formats.FORMATS`` ("hermes", "llama3", ...)."""
        ...

    @property
    def stop(self) -> tuple[str, ...]:
        """Stop strings added while tools are offered."""
        ...

    def system_prompt(self, tools: Sequence[ToolSpec], system: str = "") -> str:
        """``system`` with the description of ``tools`` joined where the family expects it."""
        ...

    def render_calls(self, calls: Sequence[ToolCall], content: str = "") -> str:
        """An assistant turn that made ``calls``, as text for the history."""
        ...

    def render_result(self, call: ToolCall, content: str) -> tuple[str, str]:
        """``(role, text)`` of the turn that shows ``call``'s result ``content`` to the model."""
        ...


class BackendStats(Protocol):
    """Counters since the backend was created (``app.engine.stream.EngineStats``); read by /metrics."""

    @property
    def requests(self) -> int: ...

    @property
    def completed(self) -> int: ...

    @property
    def cancelled(self) -> int: ...

    @property
    def failed(self) -> int: ...

    @property
    def crashes(self) -> int: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...


class Backend(Protocol):
    """A chat backend as the turn pipeline, the port, the pool, the reranker and the adapters use it.

    Token counts are of the backend's vocabulary (a remote without a tokenizer endpoint approximates them);
    ``n_ctx`` and ``n_parallel`` are in tokens and sequences. Any method may raise ``EngineCrashed`` when the
    backend is closed or died (a local engine restarts on the next request)."""

    # -- what it is --------------------------------------------------------------------------------------
    @property
    def model_path(self) -> str:
        """The GGUF path (local) or the remote's name; ``catalog.registry.model_id`` of it is the model id."""
        ...

    @property
    def settings(self) -> LoadSettings:
        """Load settings; ``settings.n_ctx`` is the context window in tokens (the prompt budget's total)."""
        ...

    @property
    def info(self) -> dict[str, Any]:
        """What ``load`` reported: ``model`` (file or remote name), ``template`` (the chat template's name),
        ``n_ctx`` and more; ``{}`` before the first load."""
        ...

    @property
    def stats(self) -> BackendStats:
        """Request counters since creation."""
        ...

    @property
    def n_parallel(self) -> int:
        """Requests served at once (>= 1); more wait, highest ``GenerateRequest.priority`` first."""
        ...

    @property
    def alive(self) -> bool:
        """Loaded and able to answer now."""
        ...

    # -- lifecycle -------------------------------------------------------------------------------------
    def load(self) -> dict[str, Any]:
        """Start the backend (validate and load the model, or probe the remote); returns ``info``. Raises
        ``ModelLoadError`` (bad file, unknown remote model, aborted by ``close``) or ``EngineCrashed``."""
        ...

    def close(self) -> None:
        """Stop it: running generations end, a load in progress is aborted. Closing twice is harmless."""
        ...

    # -- generation ------------------------------------------------------------------------------------
    def generate(self, request: GenerateRequest) -> BackendStream:
        """Queue ``request``; its stream. Raises ``InvalidRequest`` at once for parameters the backend
        cannot serve; the rest is raised while iterating (``BackendStream``)."""
        ...

    def complete(self, request: GenerateRequest) -> Done:
        """Run ``request`` to its end; its ``Done`` (``text``: the whole answer)."""
        ...

    def tool_format(self, template: str | None = None) -> ToolDialect:
        """The tool-call dialect the model writes under ``template`` (None: its own)."""
        ...

    def queue_depth(self) -> int:
        """Requests waiting for a slot now."""
        ...

    def active(self) -> int:
        """Requests running in a slot now."""
        ...

    def cache_stats(self) -> dict[str, Any]:
        """The prefix cache's counters (``{}`` without one)."""
        ...

    # -- vocabulary (never waits behind a generation) --------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = False, special: bool = False) -> list[int]:
        """Token ids of ``text``. ``add_bos``: prepend BOS; ``special``: read control-token text as control
        tokens. A remote without a tokenizer returns as many zeros as its estimate (a count, not ids)."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` (no BOS, control-token text counted as plain text)."""
        ...

    def detokenize(self, tokens: list[int]) -> str:
        """The text of ``tokens`` (invalid UTF-8 replaced). A remote raises ``HearthError``."""
        ...

    def token_piece_bytes(self, token_id: int) -> bytes:
        """The exact bytes of one token (``b""`` for control tokens; may be part of a UTF-8 sequence). A
        remote raises ``InvalidRequest`` (param ``logprobs``)."""
        ...

    def render(self, request: GenerateRequest) -> RenderedText:
        """The prompt ``request`` would be given, template applied (a remote: a best-effort text for
        counting tokens only)."""
        ...
