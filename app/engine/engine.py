"""``Engine``: the in-process handle to the chat engine process.

llama.cpp can abort its process on some inputs, so the ``Llama`` lives in a child process (spawned, so it
is safe next to Qt and threads). The handle:

- validates the model file with ``gguf_info`` before llama.cpp sees it (a bad file is a ``ModelLoadError``,
  never a dead process);
- serves requests one at a time in FIFO order (a ticket queue; ``max_queue`` waiting requests at most, then
  ``QueueFull``): the desktop UI and the HTTP port share it;
- streams events (``Delta`` … ``Done``) to the caller; closing the stream or calling ``cancel`` stops the
  generation within one decode step or one prefill chunk;
- turns a dead child into ``EngineCrashed`` (with the signal) and starts a fresh child on the next request.

Metrics clocks (``time.perf_counter`` in this process) are defined on ``app.engine.types.Metrics``.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import signal
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from app.engine.types import Delta, Done, GenerateRequest, LoadSettings, Metrics
from app.errors import Cancelled, EngineCrashed, HearthError, ModelLoadError, QueueFull

log = logging.getLogger(__name__)

_CTX = mp.get_context("spawn")


# ------------------------------------------------------------------------------------------------------
# child process
# ------------------------------------------------------------------------------------------------------
def _child_main(conn, cancel_event, model_path: str, settings: LoadSettings, meta: dict,
                cache_cfg: dict | None) -> None:
    """Engine process entry point: load, then serve commands from ``conn`` until ``close``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C goes to the parent, which cancels
    _exit_with_parent()
    tune_openmp()
    from app.engine.runtime import Runtime

    try:
        cache = None
        if cache_cfg:
            from app.engine.prefix_cache import PrefixCache

            cache = PrefixCache.for_runtime(model_path, settings, **cache_cfg)
        rt = Runtime(model_path, settings, meta, prefix_cache=cache)
    except HearthError as exc:
        conn.send(("load_error", exc))
        return
    except Exception as exc:  # noqa: BLE001 - anything from llama.cpp becomes a load error
        conn.send(("load_error", ModelLoadError(f"{type(exc).__name__}: {exc}", path=model_path)))
        return
    conn.send(("ready", {"template": rt.template_name, "n_ctx": settings.n_ctx, "load_s": rt.load_s,
                         "n_vocab": rt.n_vocab}))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        op = msg[0]
        if op == "close":
            return
        try:
            if op == "generate":
                req: GenerateRequest = msg[1]

                def emit(kind, *payload):
                    conn.send((kind, *payload))

                result = rt.generate(req, emit, cancel_event.is_set)
                conn.send(("done", *result))
            elif op == "tokenize":
                conn.send(("result", rt.tokenize(msg[1], add_bos=msg[2], special=msg[3])))
            elif op == "detokenize":
                conn.send(("result", rt.detokenize(msg[1])))
            elif op == "render":
                conn.send(("result", rt.render(msg[1])))
            elif op == "cache_stats":
                conn.send(("result", rt.prefix_cache.stats() if rt.prefix_cache else {}))
            elif op == "abort":  # test hook: behave like llama.cpp's GGML_ABORT
                import os

                os.abort()
            else:
                conn.send(("error", HearthError(f"unknown engine command {op!r}")))
        except HearthError as exc:
            conn.send(("error", exc))
        except (BrokenPipeError, EOFError, ConnectionResetError):
            return  # the parent is gone
        except Exception as exc:  # noqa: BLE001 - a bug: report it, keep serving
            log.exception("engine command %s failed", op)
            conn.send(("error", HearthError(f"unexpected engine error: {type(exc).__name__}: {exc}")))


def tune_openmp() -> None:
    """Call before llama.cpp is loaded. llama.cpp's OpenMP threads spin-wait at every barrier (libgomp's default
    spin count is 300,000); when another process holds a core, decode collapses. Measured here, 2 threads on 2
    cores, decode tokens/s idle / with one busy process: default spin 48 / 7.5; ``GOMP_SPINCOUNT=1000`` 48.5 /
    23.6; one thread 27.7 / 27.5. So Hearth sets 1000 unless the environment already sets it (or
    ``OMP_WAIT_POLICY``)."""
    import os

    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = os.environ.get("HEARTH_GOMP_SPINCOUNT", "1000")


def _exit_with_parent() -> None:
    """If the parent dies (even by SIGKILL), end this process within a second instead of running on."""
    import os

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


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
    """Owner of the chat engine process.

    ``model_path``: a GGUF file (validated on ``load``). ``settings``: ``LoadSettings``. ``prefix_cache``:
    a dict of ``PrefixCache`` options (``dir``, ``budget_bytes``, ``min_tokens``) or None to disable it.
    ``max_queue``: requests allowed to wait behind the running one.
    """

    def __init__(self, model_path: str | Path, settings: LoadSettings | None = None, *,
                 prefix_cache: dict | None = None, max_queue: int = 16) -> None:
        self.model_path = str(model_path)
        self.settings = (settings or LoadSettings()).validate()
        self.cache_cfg = prefix_cache
        self.max_queue = max_queue
        self.stats = EngineStats()
        self.info: dict[str, Any] = {}
        self.model_info: Any = None
        self._proc = None
        self._conn = None
        self._cancel = _CTX.Event()
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._serving = 0  # ticket now allowed to run
        self._waiting = 0
        self._current: Generation | None = None
        self._closed = False
        self._loading = None  # the child process while ``load`` waits for it (``close`` kills it: abort)

    # -- lifecycle ------------------------------------------------------------------------------------
    def load(self) -> dict:
        """Validate the model file and start the engine process. Returns ``info`` (template, n_ctx, load_s).
        Raises ``ModelLoadError`` with a specific message for a bad file."""
        from app.engine.gguf_info import inspect_model

        info = inspect_model(self.model_path, require_chat=True)
        self.model_info = info
        meta = {"chat_template": info.chat_template, "architecture": info.architecture, "name": info.name}
        parent, child = _CTX.Pipe(duplex=True)
        proc = _CTX.Process(target=_child_main, name="hearth-engine", daemon=True,
                            args=(child, self._cancel, self.model_path, self.settings, meta, self.cache_cfg))
        proc.start()
        child.close()
        self._loading = proc
        try:
            msg = parent.recv()
        except (EOFError, OSError):
            proc.join(5)
            why = "the load was aborted" if self._closed else _exit_text(proc)
            raise ModelLoadError(f"the engine process died while loading the model ({why})",
                                 path=self.model_path) from None
        finally:
            self._loading = None
        if msg[0] == "load_error":
            proc.join(5)
            raise msg[1]
        self._proc, self._conn = proc, parent
        self.info = {**msg[1], "model": Path(self.model_path).name, "model_path": self.model_path}
        return self.info

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def close(self) -> None:
        """Stop the engine process (waits up to 5 s, then kills it)."""
        self._closed = True
        loading = self._loading
        if loading is not None and loading.is_alive():  # abort a load in progress (another thread waits)
            loading.kill()
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is None:
            return
        try:
            conn.send(("close",))
        except (OSError, EOFError, BrokenPipeError):
            pass
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        conn.close()

    def __enter__(self) -> "Engine":
        if not self.alive:
            self.load()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests -------------------------------------------------------------------------------------
    def generate(self, request: GenerateRequest) -> Generation:
        """Queue ``request`` and return its stream (nothing runs until it is iterated).
        Raises ``InvalidRequest`` at once for bad parameters."""
        return Generation(self, request)

    def complete(self, request: GenerateRequest) -> Done:
        """Run ``request`` to the end and return its ``Done`` (``text`` holds the whole answer)."""
        return self.generate(request).result()

    def tokenize(self, text: str, add_bos: bool = False, special: bool = False) -> list[int]:
        """Token ids of ``text`` under the loaded model's vocabulary."""
        return self._call("tokenize", text, add_bos, special)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text))

    def detokenize(self, tokens: list[int]) -> str:
        return self._call("detokenize", list(tokens))

    def render(self, request: GenerateRequest):
        """The ``RenderedPrompt`` (template applied) that ``request`` would be given."""
        return self._call("render", request)

    def cache_stats(self) -> dict:
        return self._call("cache_stats")

    def queue_depth(self) -> int:
        with self._cond:
            return self._waiting

    def _call(self, op: str, *args):
        with self._turn(None):
            self._ensure_running()
            try:
                self._conn.send((op, *args))
                msg = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                raise self._crashed(op) from None
            if msg[0] == "error":
                raise msg[1]
            return msg[1]

    def _ensure_running(self) -> None:
        if self._closed:
            raise EngineCrashed("the engine was closed")
        if not self.alive:
            if self._proc is not None:
                log.warning("engine process is dead; restarting")
            self.load()

    def _crashed(self, doing: str) -> EngineCrashed:
        proc = self._proc
        if proc is not None:
            proc.join(5)
        why = _exit_text(proc) if proc is not None else "no process"
        self.stats.crashes += 1
        self._proc = None
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        return EngineCrashed(f"the engine process died during {doing} ({why}); it restarts on the next request")

    def crash_for_test(self) -> None:
        """Make the engine process abort (as llama.cpp's GGML_ABORT does); for tests."""
        with self._turn(None):
            self._ensure_running()
            self._conn.send(("abort",))
            try:
                self._conn.recv()
            except (EOFError, OSError):
                pass
            raise self._crashed("a forced abort")

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
            if self._current is gen:
                self._cancel.set()

    # -- the stream -----------------------------------------------------------------------------------
    def _run(self, gen: Generation) -> Iterator[Delta | Done]:
        """Wait for this request's turn (FIFO), then stream it through ``_stream``."""
        t_call = time.perf_counter()
        self.stats.requests += 1
        with self._turn(gen):
            t0 = time.perf_counter()
            if gen.cancelled:
                self.stats.cancelled += 1
                raise Cancelled("cancelled before it started")
            self._cancel.clear()
            yield from self._stream(gen, t_call, t0)

    def _stream(self, gen: Generation, t_call: float, t0: float) -> Iterator[Delta | Done]:
        """Run ``gen`` in the engine process (its turn is held). ``t_call`` / ``t0``: when it was called / when
        its turn came (the clocks of ``Metrics``)."""
        self._ensure_running()
        conn = self._conn
        try:
            conn.send(("generate", gen.request))
        except (OSError, BrokenPipeError):
            raise self._crashed("generation") from None
        times: list[float] = []
        finished = False
        try:
            while True:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    self.stats.failed += 1
                    raise self._crashed("generation") from None
                kind = msg[0]
                if kind == "delta":
                    if msg[2]:
                        times.append(time.perf_counter())
                    yield Delta(msg[1], tuple(msg[2]), tuple(msg[3]))
                elif kind == "done":
                    finished = True
                    _, finish, text, cm, info = msg
                    m = _metrics(t_call, t0, times, cm)
                    self._count(m)
                    gen.done = Done(finish, m, text, {**info, "n_ctx": self.settings.n_ctx})
                    yield gen.done
                    return
                elif kind == "error":
                    finished = True
                    if isinstance(msg[1], Cancelled):
                        self.stats.cancelled += 1
                    else:
                        self.stats.failed += 1
                    raise msg[1]
        finally:
            if not finished and self._conn is conn and self.alive:
                # The consumer left early (closed the stream, client disconnected): cancel and drain
                # so the next request starts on a quiet engine.
                self._cancel.set()
                self.stats.cancelled += 1
                self._drain(conn)

    def _drain(self, conn) -> None:
        try:
            while True:
                msg = conn.recv()
                if msg[0] in ("done", "error"):
                    return
        except (EOFError, OSError):
            self._crashed("cancellation")

    def _count(self, m: Metrics) -> None:
        s = self.stats
        s.completed += 1
        s.prompt_tokens += m.prompt_tokens
        s.cached_tokens += m.cached_tokens
        s.completion_tokens += m.completion_tokens


def _exit_text(proc) -> str:
    code = proc.exitcode
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


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
        peak_rss_bytes=cm.get("peak_rss_bytes", 0),
    )
