"""``Engine``: the in-process handle to the chat engine.

llama.cpp can abort its process on some inputs, so the ``Llama`` lives in a child process hosted by
``app.engine.process.ChildHost`` (spawned, so it is safe next to Qt and threads; one wire protocol, timeout
policy and parent watch shared with the embedder). The handle:

- validates the model file with ``gguf_info`` before llama.cpp sees it (a bad file is a ``ModelLoadError``,
  never a dead process);
- serves generations one at a time in FIFO order (a ticket queue; ``max_queue`` waiting requests at most,
  then ``QueueFull``): the desktop UI and the HTTP port share it;
- streams events (``Delta`` … ``Done``) to the caller; closing the stream or calling ``cancel`` stops the
  generation within one decode step or one prefill chunk;
- answers vocabulary questions (``tokenize``, ``count_tokens``, ``detokenize``, ``token_piece_bytes``,
  ``render``) on the child's *side lane*, without a turn in the FIFO: a server formatting logprobs or
  counting evidence tokens never waits behind the generation it serves, and no other process maps llama.cpp;
- turns a dead child into ``EngineCrashed`` (with the signal) and starts a fresh child on the next request.

Where the runtime runs is the constructor's ``runtime`` argument: by default a llama.cpp ``Runtime`` in the
child process; a scripted runtime (any ``EngineRuntime``) on threads of this process, behind the same queue,
streams and metrics.

Metrics clocks (``time.perf_counter`` in this process) are defined on ``app.engine.types.Metrics``.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Protocol

from app.engine.process import ChildHost
from app.engine.types import Delta, Done, GenerateRequest, LoadSettings, Metrics
from app.errors import Cancelled, EngineCrashed, HearthError, ModelLoadError, QueueFull

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------------
# the runtime, and the child-side handler that serves it
# ------------------------------------------------------------------------------------------------------
class EngineRuntime(Protocol):
    """What the engine's child side runs (``app.engine.runtime.Runtime``, or a scripted one for tests).

    ``generate`` runs on the main lane: ``emit("delta", text, token_ids, logprobs)`` per token (``logprobs``:
    ``(token_id, logprob, [(token_id, logprob), ...])`` per token, or ``()``), ``cancelled()`` polled between
    prefill chunks and tokens (raise ``Cancelled``); returns ``(finish_reason, text, child_metrics, info)``.
    The vocabulary methods run on the side lane, possibly while ``generate`` runs: they must only read."""

    def ready_info(self) -> dict: ...  # template, n_ctx, load_s, n_vocab

    def generate(self, request: GenerateRequest, emit: Callable[..., None],
                 cancelled: Callable[[], bool]) -> tuple[str, str, dict, dict]: ...

    def cache_stats(self) -> dict: ...

    def tokenize(self, text: str, add_bos: bool, special: bool) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str: ...

    def piece_bytes(self, token: int) -> bytes: ...

    def render(self, request: GenerateRequest) -> Any: ...  # a RenderedPrompt


_SIDE_OPS = frozenset({"tokenize", "detokenize", "piece_bytes", "render"})


class _Service:
    """The ``Handler`` of the engine child: ``generate`` / ``cache_stats`` on the main lane, the vocabulary on
    the side lane."""

    def __init__(self, runtime: EngineRuntime) -> None:
        self.runtime = runtime

    def ready_info(self) -> dict:
        return self.runtime.ready_info()

    def call(self, op: str, args: tuple, emit: Callable[..., None], cancelled: Callable[[], bool]) -> Any:
        if op == "generate":
            return self.runtime.generate(args[0], emit, cancelled)
        if op == "cache_stats":
            return self.runtime.cache_stats()
        raise HearthError(f"unknown engine command {op!r}")

    def side(self, op: str, args: tuple) -> Any:
        if op not in _SIDE_OPS:
            raise HearthError(f"unknown engine vocabulary command {op!r}")
        return getattr(self.runtime, op)(*args)


def _llama_service(model_path: str, settings: LoadSettings, meta: dict, cache_cfg: Optional[dict]) -> _Service:
    """Runs in the engine child: load the model (and the prefix cache). Any failure is a ``ModelLoadError``."""
    from app.engine.runtime import Runtime

    try:
        cache = None
        if cache_cfg:
            from app.engine.prefix_cache import PrefixCache

            cache = PrefixCache.for_runtime(model_path, settings, **cache_cfg)
        return _Service(Runtime(model_path, settings, meta, prefix_cache=cache))
    except HearthError:
        raise
    except Exception as exc:  # noqa: BLE001 - anything from llama.cpp becomes a load error
        raise ModelLoadError(f"{type(exc).__name__}: {exc}", path=model_path) from None


def _scripted_service(make_runtime: Callable[[], EngineRuntime]) -> _Service:
    return _Service(make_runtime())


# ------------------------------------------------------------------------------------------------------
# parent handle
# ------------------------------------------------------------------------------------------------------
@dataclass
class EngineStats:
    """Counters since the engine was created (for /metrics and the UI)."""

    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    crashes: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


class Generation:
    """One request's stream. Iterate it for ``Delta`` events and a final ``Done``; ``cancel()`` (any thread)
    stops it. ``result()`` drains it and returns the ``Done``."""

    def __init__(self, engine: "Engine", request: GenerateRequest) -> None:
        self._engine = engine
        self.request = request.validate()
        self.cancelled = False
        self.done: Done | None = None
        self._iter = engine._run(self)

    def __iter__(self) -> Iterator[Delta | Done]:
        return self._iter

    def __next__(self) -> Delta | Done:
        return next(self._iter)

    def cancel(self) -> None:
        self.cancelled = True
        self._engine._cancel_if_current(self)

    def close(self) -> None:
        """Stop the generation (if running) and release the engine."""
        self.cancel()
        self._iter.close()

    def result(self) -> Done:
        for _ev in self._iter:
            pass
        assert self.done is not None
        return self.done


class Engine:
    """Owner of the chat engine's runtime.

    ``model_path``: a GGUF file (validated on ``load``). ``settings``: ``LoadSettings``. ``prefix_cache``:
    a dict of ``PrefixCache`` options (``dir``, ``budget_bytes``, ``min_tokens``) or None to disable it.
    ``max_queue``: requests allowed to wait behind the running one.

    ``runtime``: where the runtime runs. None (the default): a llama.cpp ``Runtime`` for ``model_path`` in a
    spawned child process. A callable: it is called on a thread of this process and returns the
    ``EngineRuntime`` to serve (no child process, no model file is read, ``prefix_cache`` is not used):
    scripted runtimes run behind the same FIFO, streams, cancellation and metrics as the real one.
    """

    def __init__(self, model_path: str | Path, settings: LoadSettings | None = None, *,
                 prefix_cache: dict | None = None, max_queue: int = 16,
                 runtime: Optional[Callable[[], EngineRuntime]] = None) -> None:
        self.model_path = str(model_path)
        self.settings = (settings or LoadSettings()).validate()
        self.cache_cfg = prefix_cache
        self.max_queue = max_queue
        self.stats = EngineStats()
        self.info: dict[str, Any] = {}
        self.model_info: Any = None
        self._runtime = runtime
        self._host: Optional[ChildHost] = None
        self._pieces: dict[int, bytes] = {}  # token id -> bytes (token_piece_bytes)
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._serving = 0  # ticket now allowed to run
        self._waiting = 0
        self._current: Generation | None = None
        self._closed = False
        self._load_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------------
    def load(self) -> dict:
        """Validate the model file and start the runtime (a fresh child process). Returns ``info`` (template,
        n_ctx, load_s, n_vocab, model, model_path). Raises ``ModelLoadError`` with a specific message for a bad
        file, or when ``close()`` aborted the load."""
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

    def _make_host(self) -> ChildHost:
        if self._runtime is not None:
            return ChildHost("hearth-engine", _scripted_service, (self._runtime,), label="the engine",
                             side_lane=True, in_thread=True, on_crash=self._on_crash)
        from app.engine.gguf_info import inspect_model

        info = inspect_model(self.model_path, require_chat=True)
        self.model_info = info
        meta = {"chat_template": info.chat_template, "architecture": info.architecture, "name": info.name}
        return ChildHost("hearth-engine", _llama_service, (self.model_path, self.settings, meta, self.cache_cfg),
                         label="the engine process", model_path=self.model_path, side_lane=True,
                         on_crash=self._on_crash)

    def _on_crash(self) -> None:
        self.stats.crashes += 1

    @property
    def alive(self) -> bool:
        return self._host is not None and self._host.alive

    @property
    def pid(self) -> Optional[int]:
        """Process id of the engine child (None when none runs, or for a runtime on threads)."""
        return self._host.pid if self._host is not None else None

    def close(self) -> None:
        """Stop the runtime (cancels a running generation; waits up to 5 s, then kills the child); a load in
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

    # -- generation (FIFO) ----------------------------------------------------------------------------
    def generate(self, request: GenerateRequest) -> Generation:
        """Queue ``request`` and return its stream (nothing runs until it is iterated).
        Raises ``InvalidRequest`` at once for bad parameters."""
        return Generation(self, request)

    def complete(self, request: GenerateRequest) -> Done:
        """Run ``request`` to the end and return its ``Done`` (``text`` holds the whole answer)."""
        return self.generate(request).result()

    def cache_stats(self) -> dict:
        """The prefix cache's counters (``{}`` without one); takes a turn in the FIFO."""
        with self._turn(None):
            return self._running().request("cache_stats")

    def queue_depth(self) -> int:
        with self._cond:
            return self._waiting

    def crash_for_test(self) -> None:
        """Make the engine process abort (as llama.cpp's GGML_ABORT does); for tests. Raises the
        ``EngineCrashed`` it causes."""
        with self._turn(None):
            raise self._running().crash_for_test()

    # -- vocabulary (side lane: no turn in the FIFO) --------------------------------------------------
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

    # -- FIFO turn-taking -----------------------------------------------------------------------------
    class _Turn:
        def __init__(self, engine: "Engine", gen: Generation | None) -> None:
            self.e, self.gen = engine, gen

        def __enter__(self):
            e = self.e
            with e._cond:
                if e._waiting >= e.max_queue:
                    raise QueueFull(f"{e._waiting} requests are already waiting for the engine", 2.0)
                ticket = next(e._tickets)
                e._waiting += 1
                try:
                    while e._serving != ticket:
                        e._cond.wait()
                finally:
                    e._waiting -= 1
                e._current = self.gen
            return self

        def __exit__(self, *exc):
            e = self.e
            with e._cond:
                e._current = None
                e._serving += 1
                e._cond.notify_all()

    def _turn(self, gen: Generation | None) -> "_Turn":
        return Engine._Turn(self, gen)

    def _cancel_if_current(self, gen: Generation) -> None:
        with self._cond:
            if self._current is gen and self._host is not None:
                self._host.cancel()

    # -- the stream -----------------------------------------------------------------------------------
    def _run(self, gen: Generation) -> Iterator[Delta | Done]:
        """Wait for this request's turn (FIFO), then stream it through ``_stream``."""
        t_call = time.perf_counter()
        self.stats.requests += 1
        with self._turn(gen):
            t0 = time.perf_counter()
            host = self._running()
            host.clear_cancel()  # before the check: a cancel() from now on is seen by one or the other
            if gen.cancelled:
                self.stats.cancelled += 1
                raise Cancelled("cancelled before it started")
            yield from self._stream(host, gen, t_call, t0)

    def _stream(self, host: ChildHost, gen: Generation, t_call: float, t0: float) -> Iterator[Delta | Done]:
        """Run ``gen`` on the runtime (its turn is held). ``t_call`` / ``t0``: when it was called / when its
        turn came (the clocks of ``Metrics``)."""
        call = host.call("generate", gen.request)
        times: list[float] = []
        try:
            for _kind, text, ids, lps in call:
                if ids:
                    times.append(time.perf_counter())
                yield Delta(text, tuple(ids), tuple(lps))
        except Cancelled:
            self.stats.cancelled += 1
            raise
        except Exception:
            self.stats.failed += 1
            raise
        finally:
            if call.open:
                # The consumer left early (closed the stream, client disconnected): cancel and drain
                # so the next request starts on a quiet engine.
                host.cancel()
                self.stats.cancelled += 1
                call.drain()
        finish, text, cm, info = call.result
        m = _metrics(t_call, t0, times, cm)
        self._count(m)
        gen.done = Done(finish, m, text, {**info, "n_ctx": self.settings.n_ctx})
        yield gen.done

    def _count(self, m: Metrics) -> None:
        s = self.stats
        s.completed += 1
        s.prompt_tokens += m.prompt_tokens
        s.cached_tokens += m.cached_tokens
        s.completion_tokens += m.completion_tokens


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


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
        itl_p50_s=_pct(itl, 0.5), itl_p95_s=_pct(itl, 0.95), itl_max_s=max(itl) if itl else 0.0,
        prefill_s=prefill_s, prefill_tps=((prompt - cached) / prefill_s) if prefill_s > 0 else 0.0,
        decode_tps=(len(itl) / decode_span) if decode_span > 0 else 0.0,
        total_s=end - t0, queue_s=t0 - t_call, restore_s=cm.get("restore_s", 0.0),
        cache_source=cm.get("cache_source", "none"), cache_error=cm.get("cache_error", ""),
        cache_reuse=cm.get("cache_reuse", "cold"), cache_reuse_reason=cm.get("cache_reuse_reason", ""),
        peak_rss_bytes=cm.get("peak_rss_bytes", 0),
    )
