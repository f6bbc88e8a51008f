"""``Engine``: the in-process handle to the chat engine.

The ``Llama`` lives in a child process (``app.childhost.host.ChildHost``), since llama.cpp can abort its
process on some inputs. The handle validates the model file first, queues and batches requests, streams
events, answers vocabulary questions on a side lane and turns a dead child into ``EngineCrashed``.

The reasoning: docs/engine.md, 'Processes and safety', 'The process host and the vocabulary lane
(`app/childhost/`)' and 'Metrics'.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Protocol

from app.childhost import ChildHost, MuxCall, Timeouts
from app.engine.chat.templates import tool_format
from app.engine.chat.tool_formats import FORMATS, ToolFormat
from app.engine.local.scheduler import Scheduler, SeqRuntime
from app.engine.stream import EngineStats, StreamHandle, percentile
from app.errors import Cancelled, EngineCrashed, HearthError, InvalidRequest, ModelLoadError, QueueFull
from app.protocol.types import SPECULATIVE_MODES, Delta, Done, GenerateRequest, LoadSettings, Metrics

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------------
# the runtime, and the child-side handler that serves it
# ------------------------------------------------------------------------------------------------------
class EngineRuntime(SeqRuntime, Protocol):
    """What the engine's child side runs (``app.engine.local.runtime.Runtime``, or a scripted one for tests): a
    ``SeqRuntime`` driven by the scheduler (``app.engine.local.scheduler``) on the main thread, and the vocabulary,
    served on the side lane, possibly while a step runs: those methods must only read."""

    def tokenize(self, text: str, add_bos: bool, special: bool) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str: ...

    def piece_bytes(self, token: int) -> bytes: ...

    def render(self, request: GenerateRequest) -> Any: ...  # a RenderedPrompt

    def close(self) -> None: ...  # the engine process is ending (after the scheduler's loop)


_SIDE_OPS = frozenset({"tokenize", "detokenize", "piece_bytes", "render"})


class _Service:
    """The ``MuxHandler`` of the engine child: the scheduler on the main lane, the vocabulary on the side
    lane."""

    def __init__(self, runtime: EngineRuntime) -> None:
        self.runtime = runtime

    def ready_info(self) -> dict:
        return {"n_parallel": self.runtime.n_slots, **self.runtime.ready_info()}

    def serve(self, inbox: Any, send: Callable[[tuple], bool]) -> None:
        try:
            Scheduler(self.runtime, send).run(inbox)
        finally:
            self.runtime.close()  # the prefix cache's pending writes reach the disk before the process ends

    def side(self, op: str, args: tuple) -> Any:
        if op not in _SIDE_OPS:
            raise HearthError(f"unknown engine vocabulary command {op!r}")
        return getattr(self.runtime, op)(*args)


def _llama_service(model_path: str, settings: LoadSettings, meta: dict, cache_cfg: Optional[dict]) -> _Service:
    """Runs in the engine child: load the model (and the prefix cache). Any failure is a ``ModelLoadError``."""
    from app.engine.local.runtime import Runtime

    try:
        cache = None
        if cache_cfg:
            from app.engine.local.prefix_cache import PrefixCache

            cache = PrefixCache.for_runtime(model_path, settings, **cache_cfg)
        return _Service(Runtime(model_path, settings, meta, prefix_cache=cache))
    except HearthError:
        raise
    except Exception as exc:  # noqa: BLE001 - anything from llama.cpp becomes a load error
        raise ModelLoadError(f"{type(exc).__name__}: {exc}", path=model_path) from None


class Generation(StreamHandle):
    """One request's stream. Iterate it for ``Delta`` events and a final ``Done``; ``cancel()`` (any thread)
    stops it. ``result()`` drains it and returns the ``Done``."""

    def __init__(self, engine: "Engine", request: GenerateRequest) -> None:
        self._engine = engine
        self.request = request.validate()
        self.cancelled = False
        self.done: Done | None = None
        self.thinks: bool | None = None  # the request may think (known once admitted)
        self.thought_closed = False  # answer text came after thinking text
        self._stopped = False  # stop_thinking was sent
        self._call: Optional[MuxCall] = None
        self._iter = engine._run(self)

    def stop_thinking(self) -> bool:
        """End this request's thinking at its next token (budget forcing: the end-of-thinking text is inserted
        and the model goes on with its answer). True when it will: the request runs (or waits) and may think,
        and its thinking has not ended yet; False otherwise (finished, a model and request without thinking,
        or the answer already began after thinking, or an earlier call already asked). Any thread."""
        call = self._call
        if self.done is not None or call is None or self.thinks is False or self.thought_closed or self._stopped:
            return False
        self._stopped = call.control("stop_thinking")  # a second call: already asked, the end is on its way
        return self._stopped

    def cancel(self) -> None:
        """Stop this request (only this one): within one scheduler step, or before it starts."""
        self.cancelled = True
        call = self._call
        if call is not None:
            call.cancel()

    def close(self) -> None:
        """Stop the generation (if running) and release its slot."""
        self.cancel()
        self._iter.close()


class Engine:
    """Owner of the chat engine's runtime.

    ``model_path``: a GGUF file (validated on ``load``). ``settings``: ``LoadSettings`` (``n_parallel`` None:
    chosen from the memory estimate on load, ``memory_estimate.choose_parallel``). ``prefix_cache``: a dict of
    ``PrefixCache`` options (``dir``, ``budget_bytes``, ``min_tokens``) or None to disable it. ``max_queue``:
    requests allowed to wait while every slot is busy; one more is refused with ``QueueFull``.

    Requests run concurrently, ``n_parallel`` at a time, batched by the engine process's scheduler
    (``app.engine.local.scheduler``); the others wait there, highest ``GenerateRequest.priority`` first.

    ``runtime``: where the runtime runs. None (the default): a llama.cpp ``Runtime`` for ``model_path`` in a
    spawned child process. A callable: it is called on a thread of this process and returns the
    ``EngineRuntime`` to serve (no child process, no model file is read, ``prefix_cache`` is not used):
    scripted runtimes run behind the same scheduler, queue, streams, cancellation and metrics as the real one.

    Speculative decoding (docs/speculative.md): ``draft_model``, a GGUF path with the same vocabulary, loaded
    next to the model for ``speculative="draft"`` (``ModelLoadError`` naming both when the vocabularies
    differ); ``speculative``, the model's default mode for requests that do not set
    ``GenerateRequest.speculative`` ("auto", "prompt_lookup", "draft", "off", or None: "auto", adaptive prompt
    lookup where it pays; anything else is ``InvalidRequest``).
    ``thinking_markers``: the model's own markers (``reasoning.markers_for`` overrides: ``{"start", "end",
    ...}``; None: found from the template), checked when the engine loads.
    ``watchdog_s``: seconds the engine process may send no heartbeat before it is declared frozen, killed and
    restarted on the next request (None: ``Timeouts.unresponsive_s``; docs/engine.md, "Watchdog").
    """

    def __init__(self, model_path: str | Path, settings: LoadSettings | None = None, *,
                 prefix_cache: dict | None = None, max_queue: int = 16,
                 runtime: Optional[Callable[[], EngineRuntime]] = None, draft_model: str | Path | None = None,
                 speculative: str | None = None, thinking_markers: dict | None = None,
                 watchdog_s: float | None = None) -> None:
        self.model_path = str(model_path)
        self.thinking_markers = dict(thinking_markers) if thinking_markers else None
        self.draft_model = str(draft_model) if draft_model else None
        if speculative is not None and speculative not in SPECULATIVE_MODES:
            raise InvalidRequest(f"speculative must be one of {', '.join(SPECULATIVE_MODES)} or None, got "
                                 f"{speculative!r}", param="speculative")
        self.speculative = speculative
        self.settings = (settings or LoadSettings()).validate()
        self.cache_cfg = prefix_cache
        self.max_queue = max_queue
        if watchdog_s is not None and not watchdog_s > 0:
            raise ValueError(f"watchdog_s must be a number of seconds > 0, got {watchdog_s!r}")
        self.timeouts = Timeouts() if watchdog_s is None else Timeouts(unresponsive_s=watchdog_s)
        self.stats = EngineStats()
        self.info: dict[str, Any] = {}
        self.model_info: Any = None
        self._runtime = runtime
        self._host: Optional[ChildHost] = None
        self._pieces: dict[int, bytes] = {}  # token id -> bytes (token_piece_bytes)
        self._lock = threading.Lock()
        self._outstanding = 0  # requests submitted and not ended
        self._running_n = 0  # of those, admitted into a slot
        self._closed = False
        self._load_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------------
    def load(self) -> dict:
        """Validate the model file and start the runtime (a fresh child process). Returns ``info`` (template,
        n_ctx, load_s, n_vocab, n_parallel, model, model_path). Raises ``ModelLoadError`` with a specific
        message for a bad file, or when ``close()`` aborted the load."""
        host = self._make_host()
        old, self._host = self._host, host
        if old is not None:
            old.close()
        if self._closed:  # close() came first, or while the file was checked
            host.close()
            raise ModelLoadError("the engine was closed: the load was aborted", path=self.model_path)
        ready = host.start()
        self.info = {**ready, "model": Path(self.model_path).name, "model_path": self.model_path}
        return self.info

    @property
    def n_parallel(self) -> int:
        """Sequences served at once (known once loaded; before that the setting, or 1)."""
        return int(self.info.get("n_parallel") or self.settings.n_parallel or 1)

    def _make_host(self) -> ChildHost:
        make_runtime = self._runtime
        if make_runtime is not None:
            return ChildHost("hearth-engine", lambda: _Service(make_runtime()), label="the engine",
                             side_lane=True, in_thread=True, on_crash=self._on_crash, mux=True)
        from app.catalog.gguf import inspect_model

        info = inspect_model(self.model_path, require_chat=True)
        self.model_info = info
        from app.catalog.memory_estimate import resolve_parallel

        settings = resolve_parallel(info, self.settings)
        if self.draft_model:
            inspect_model(self.draft_model, require_chat=True)  # llama.cpp aborts on some bad files
        meta = {"chat_template": info.chat_template, "architecture": info.architecture, "name": info.name,
                "draft_model": self.draft_model, "speculative": self.speculative,
                "thinking_markers": self.thinking_markers}
        return ChildHost("hearth-engine", _llama_service, (self.model_path, settings, meta, self.cache_cfg),
                         label="the engine process", model_path=self.model_path, side_lane=True,
                         timeouts=self.timeouts, on_crash=self._on_crash, mux=True)

    def _on_crash(self) -> None:
        self.stats.crashes += 1

    @property
    def alive(self) -> bool:
        """The engine runs and answers: False when no child runs, or it sent no heartbeat for the watchdog's
        time (``watchdog_s``; what ``/health`` reports as ``engine_alive``)."""
        return self._host is not None and self._host.alive

    @property
    def pid(self) -> Optional[int]:
        """Process id of the engine child (None when none runs, or for a runtime on threads)."""
        return self._host.pid if self._host is not None else None

    def close(self) -> None:
        """Stop the runtime (cancels running generations; waits up to 5 s, then kills the child); a load in
        progress in another thread is aborted."""
        self._closed = True
        if self._host is not None:
            self._host.close()

    def __enter__(self) -> "Engine":
        if not self.alive:
            self.load()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- generation -----------------------------------------------------------------------------------
    def generate(self, request: GenerateRequest) -> Generation:
        """Queue ``request`` and return its stream (nothing runs until it is iterated).
        Raises ``InvalidRequest`` at once for bad parameters."""
        return Generation(self, request)

    def complete(self, request: GenerateRequest) -> Done:
        """Run ``request`` to the end and return its ``Done`` (``text`` holds the whole answer)."""
        return self.generate(request).result()

    def cache_stats(self) -> dict:
        """The prefix cache's counters (``{}`` without one); answered between two scheduler steps."""
        return self._running().request("cache_stats")

    def queue_depth(self) -> int:
        """Requests waiting for a slot (submitted, not yet admitted)."""
        with self._lock:
            return self._outstanding - self._running_n

    def active(self) -> int:
        """Requests running in a slot now."""
        with self._lock:
            return self._running_n

    # -- vocabulary (side lane: never waits for a scheduler step) ---------------------------------------
    def tokenize(self, text: str, add_bos: bool = False, special: bool = False) -> list[int]:
        """Token ids of ``text`` under the loaded model's vocabulary. ``add_bos``: prepend BOS; ``special``:
        parse control-token text (``<start_of_turn>``) as control tokens. Raises ``EngineCrashed``."""
        return self._running().side("tokenize", text, add_bos, special)

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` (no BOS, control-token text counted as plain text)."""
        return len(self.tokenize(text))

    def detokenize(self, tokens: list[int]) -> str:
        """The text of ``tokens`` (invalid UTF-8 replaced)."""
        return self._running().side("detokenize", list(tokens))

    def token_piece_bytes(self, token_id: int) -> bytes:
        """The exact bytes of one token's text (``b""`` for control tokens; may be part of a UTF-8
        sequence). Cached in this process."""
        got = self._pieces.get(token_id)
        if got is None:
            got = self._pieces[token_id] = self._running().side("piece_bytes", int(token_id))
        return got

    def render(self, request: GenerateRequest):
        """The ``RenderedPrompt`` (template applied) that ``request`` would be given."""
        return self._running().side("render", request)

    def tool_format(self, template: str | None = None) -> ToolFormat:
        """The ``ToolFormat`` whose calls the loaded model writes (and whose parser reads its answers) under
        ``template`` (None: the model's own), from the engine's ready info (``tool_format``, ``architecture``;
        a runtime that reports neither gets ``format_for``'s choice for its template name). Starts the
        engine if it is not running."""
        self._running()
        info = self.info
        own = info.get("template", "")
        if (template is None or template == own) and info.get("tool_format") in FORMATS:
            return FORMATS[info["tool_format"]]
        return tool_format(template or own, info.get("architecture", ""))

    def _running(self) -> ChildHost:
        """The host, started (the first request loads the model if ``load`` was not called)."""
        if self._closed:
            raise EngineCrashed("the engine was closed")
        if self._host is None:
            with self._load_lock:
                if self._host is None:
                    self.load()
        assert self._host is not None
        return self._host

    # -- admission ------------------------------------------------------------------------------------
    def _enter(self) -> None:
        """Count a new request in, or refuse it with ``QueueFull`` when every slot is busy and ``max_queue``
        requests already wait (Retry-After: about one request's time at the measured pace, at least 1 s)."""
        with self._lock:
            # A burst not yet admitted by the scheduler still has n_parallel slots to take (issue 29: it got
            # max(n_parallel, max_queue) places instead of their sum).
            waiting = self._outstanding - max(self._running_n, min(self._outstanding, self.n_parallel))
            if self._outstanding >= self.n_parallel and waiting >= self.max_queue:
                raise QueueFull(f"{waiting} requests are already waiting for the engine "
                                f"({self._running_n} running)", 2.0)
            self._outstanding += 1

    def _exit(self, admitted: bool) -> None:
        with self._lock:
            self._outstanding -= 1
            if admitted:
                self._running_n -= 1

    # -- the stream -----------------------------------------------------------------------------------
    def _run(self, gen: Generation) -> Iterator[Delta | Done]:
        """Submit this request to the scheduler and stream it through ``_stream``."""
        t_call = time.perf_counter()
        self.stats.requests += 1
        self._enter()
        state = {"admitted": False}
        try:
            if gen.cancelled:
                self.stats.cancelled += 1
                raise Cancelled("cancelled before it started")
            call = self._running().submit("generate", gen.request, deadline_s=gen.request.deadline_s)
            gen._call = call
            if gen.cancelled:  # cancel() ran between the check and the submit
                call.cancel()
            yield from self._stream(call, gen, t_call, state)
        finally:
            self._exit(state["admitted"])

    def _stream(self, call: MuxCall, gen: Generation, t_call: float, state: dict) -> Iterator[Delta | Done]:
        """Relay ``call``'s events. ``t_call``: when the stream began (the clocks of ``Metrics``); the
        ``admitted`` event marks the request entering its slot."""
        times: list[float] = []
        t_admit = t_call
        t_answer: Optional[float] = None  # the first answer text reached this process
        seen_thought = False
        try:
            for kind, *payload in call:
                if kind == "admitted":
                    t_admit = time.perf_counter()
                    gen.thinks = bool(payload[1]) if len(payload) > 1 else False
                    with self._lock:
                        self._running_n += 1
                    state["admitted"] = True
                    continue
                text, ids, lps = payload[:3]
                thought = payload[3] if len(payload) > 3 else ""
                now = time.perf_counter()
                if ids:
                    times.append(now)
                if thought:
                    seen_thought = True
                if text and t_answer is None:
                    t_answer = now
                    gen.thought_closed = seen_thought
                yield Delta(text, tuple(ids), tuple(lps), thought)
        except Cancelled:
            self.stats.cancelled += 1
            raise
        except Exception:
            self.stats.failed += 1
            raise
        finally:
            if call.open:
                # The consumer left early (closed the stream, client disconnected): cancel this request
                # and wait for its slot to be released.
                call.cancel()
                self.stats.cancelled += 1
                call.drain()
        finish, text, cm, info = call.result
        if not state["admitted"]:  # ended while it waited (its deadline passed): all of it was queueing
            t_admit = time.perf_counter()
        m = _metrics(t_call, t_admit, times, cm)
        if t_answer is not None:
            m.ttfat_s = t_answer - t_admit
        self._count(m)
        info = dict(info)
        reasoning = info.pop("reasoning", "")
        gen.done = Done(finish, m, text, {**info, "n_ctx": self.settings.n_ctx}, reasoning)
        yield gen.done

    def _count(self, m: Metrics) -> None:
        s = self.stats
        s.completed += 1
        s.prompt_tokens += m.prompt_tokens
        s.cached_tokens += m.cached_tokens
        s.completion_tokens += m.completion_tokens


def _metrics(t_call: float, t0: float, times: list[float], cm: dict) -> Metrics:
    end = time.perf_counter()
    itl = [b - a for a, b in zip(times, times[1:])]
    n_out = cm.get("completion_tokens", 0)
    prompt = cm.get("prompt_tokens", 0)
    cached = cm.get("cached_tokens", 0)
    prefill_s = cm.get("prefill_s", 0.0)
    decode_span = times[-1] - times[0] if len(times) > 1 else 0.0
    return Metrics(
        prompt_tokens=prompt, cached_tokens=cached, completion_tokens=n_out,
        ttft_s=(times[0] - t0) if times else (end - t0),
        tpot_s=statistics.fmean(itl) if itl else 0.0,
        itl_p50_s=percentile(itl, 0.5), itl_p95_s=percentile(itl, 0.95), itl_max_s=max(itl) if itl else 0.0,
        prefill_s=prefill_s, prefill_tps=((prompt - cached) / prefill_s) if prefill_s > 0 else 0.0,
        decode_tps=(len(itl) / decode_span) if decode_span > 0 else 0.0,
        total_s=end - t0, queue_s=t0 - t_call, restore_s=cm.get("restore_s", 0.0),
        save_s=cm.get("save_s", 0.0),
        cache_source=cm.get("cache_source", "none"), cache_error=cm.get("cache_error", ""),
        cache_reuse=cm.get("cache_reuse", "cold"), cache_reuse_reason=cm.get("cache_reuse_reason", ""),
        peak_rss_bytes=cm.get("peak_rss_bytes", 0), batch_peak=cm.get("batch_peak", 1),
        prefill_shared=cm.get("prefill_shared", False),
        reasoning_tokens=cm.get("reasoning_tokens", 0),
        answer_tokens=cm.get("answer_tokens", n_out - cm.get("reasoning_tokens", 0)),
        thinking_s=cm.get("thinking_s", 0.0), reasoning_budget=cm.get("reasoning_budget"),
        reasoning_forced=cm.get("reasoning_forced", False), reasoning_stopped_by=cm.get("reasoning_stopped_by"),
        reasoning_unclosed=cm.get("reasoning_unclosed", False),
        spec_mode=cm.get("spec_mode"), spec_drafted=cm.get("spec_drafted", 0),
        spec_accepted=cm.get("spec_accepted", 0), spec_steps=cm.get("spec_steps", 0),
    )
