"""Many models behind one port: load on demand within a memory budget, unload idle ones.

``ModelPool`` holds one engine per model id and hands each request a ``Lease`` (``acquire(name)``); a model
is never unloaded while a lease on it is held.

The reasoning: docs/server.md, 'app/engine/pool.py'.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from app.errors import HearthError, ModelLoadError
from app.protocol.backend import Backend
from app.protocol.types import LoadSettings

log = logging.getLogger(__name__)

GIB = 1 << 30
REMOTE_PREFIX = "remote:"  # the "path" of a remote engine (settings.remotes) in the pool


class ModelBusy(HearthError):
    """No room for a model while the loaded ones are busy, or it is still loading after the wait."""


@dataclass
class _Slot:
    """One model in the pool. ``state``: unloaded | loading | loaded | failed."""

    key: str
    path: str
    state: str = "unloaded"
    engine: Optional[Backend] = None
    need_bytes: int = 0
    leases: int = 0
    last_used: float = 0.0
    keep_alive_s: Optional[float] = None  # the last lease's keep_alive (None: the model's TTL)
    pinned: bool = False  # ``ModelPool.pin``: never unloaded while idle unless a lease's keep_alive says so
    error: Optional[HearthError] = None  # the last load's failure (None once it loads)
    error_stamp: Optional[tuple] = None  # the file as it was when a failure it caused was remembered
    loads: int = 0
    load_s: float = 0.0


class Lease:
    """A model held for one request: ``engine`` serves it; ``release()`` (or leaving the ``with`` block) gives
    it back. Releasing twice is harmless. ``keep_alive_s``: the request's keep_alive (None: not given), which
    sets how long the model stays idle after this lease (``ModelPool._ttl``)."""

    def __init__(self, pool: "ModelPool", slot: _Slot, keep_alive_s: Optional[float] = None) -> None:
        self._pool, self._slot = pool, slot
        self.engine = slot.engine
        self.model_id = slot.key
        self.keep_alive_s = keep_alive_s
        self._released = False

    def release(self) -> None:
        """Give the model back (once); the idle time after it is this lease's keep_alive, else the default."""
        if not self._released:
            self._released = True
            self._pool._release(self._slot, self.keep_alive_s)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def file_stamp(path: str) -> tuple:
    """``(size in bytes, mtime in ns)`` of ``path`` (``(None, None)`` when it cannot be read): a failed load is
    tried again only when this changes."""
    try:
        st = os.stat(path)
    except OSError:
        return (None, None)
    return (st.st_size, st.st_mtime_ns)


class ModelPool:
    """Engines for many models within a memory budget (docs/server.md, 'app/engine/pool.py').

    ``resolve(name) -> (model_id, path)``: the model a request names (raise ``ModelNotFound``); ``make_engine
    (model_id, path)``: a new, not yet loaded engine (its ``load()`` raises ``ModelLoadError``);
    ``estimate(model_id, path) -> bytes``: the memory it needs; ``budget_bytes``: the total the loaded models
    may use (None: no limit); ``ttl_s``: idle seconds before an unload (None or negative: never);
    ``ttl_for(model_id)``: a per-model TTL or None for the default; ``load_timeout_s``: how long a request
    waits for a load or for room; ``clock``: monotonic seconds (tests pass their own). ``blame_file``: whether a
    ``ModelLoadError`` of unknown cause (``file_fault`` None) is remembered as the file's until it changes
    (``local_pool``: False, its ``estimate`` inspects the file before every load, so a later failure is not
    the file's header).
    """

    def __init__(self, resolve: Callable[[Optional[str]], tuple[str, str]],
                 make_engine: Callable[[str, str], Any], estimate: Callable[[str, str], int], *,
                 budget_bytes: Optional[int] = None, ttl_s: Optional[float] = 300.0,
                 ttl_for: Callable[[str], Optional[float]] = lambda model_id: None, load_timeout_s: float = 300.0,
                 reaper_interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 blame_file: bool = True) -> None:
        self._resolve, self._make, self._estimate = resolve, make_engine, estimate
        self.budget_bytes = budget_bytes
        self.ttl_s, self._ttl_for = ttl_s, ttl_for
        self.load_timeout_s = load_timeout_s
        self._clock = clock
        self.blame_file = blame_file
        self._slots: dict[str, _Slot] = {}
        self._cond = threading.Condition()
        self._closed = False
        self.unloads: list[tuple[str, str]] = []  # (model_id, why), oldest first (the last 100)
        self.remote_names: tuple[str, ...] = ()  # names resolved to remote engines (local_pool)
        self._reaper: Optional[threading.Thread] = None
        if reaper_interval_s > 0:
            self._reaper = threading.Thread(target=self._reap_loop, args=(reaper_interval_s,),
                                            name="model-pool-reaper", daemon=True)
            self._reaper.start()

    # -- requests -------------------------------------------------------------------------------------
    def acquire(self, name: Optional[str], keep_alive_s: Optional[float] = None) -> Lease:
        """The engine of the model ``name`` names, loaded if needed, held until the lease is released.

        Raises ``ModelNotFound`` (unknown name), ``ModelLoadError`` (the load failed now, or before on the same
        file when the file caused it: ``file_fault``; the estimate exceeds the budget), ``ModelBusy`` (still
        loading, or no room, after ``load_timeout_s``), ``HearthError`` when the pool is closed. A failure the
        file did not cause (full disk, memory, a cache) is not remembered: the next request loads again."""
        key, path = self._resolve(name)
        deadline = self._clock() + self.load_timeout_s
        with self._cond:
            while True:
                if self._closed:
                    raise HearthError("the model pool is closed")
                slot = self._slots.setdefault(key, _Slot(key, str(path)))
                if slot.state == "loaded":
                    return self._lease(slot, keep_alive_s)
                if slot.state == "loading":
                    self._wait(deadline, f"model {key!r} is still loading after {self.load_timeout_s:g} s")
                    continue
                if slot.state == "failed" and slot.error_stamp == file_stamp(slot.path):
                    raise slot.error  # the same file failed before: the same answer, at once
                break
            slot.state = "loading"  # this request loads it; the others wait for it
        try:
            engine, need = self._load(slot, deadline)
        except BaseException as exc:
            with self._cond:
                self._failed(slot, exc)
                self._cond.notify_all()
            raise
        with self._cond:
            slot.engine, slot.need_bytes, slot.state, slot.error = engine, need, "loaded", None
            self._cond.notify_all()
            return self._lease(slot, keep_alive_s)

    def _failed(self, slot: _Slot, exc: BaseException) -> None:
        """Record ``slot``'s failed load: remembered until the file changes only when the file caused it
        (``ModelLoadError.file_fault``; None: ``blame_file``), else tried again by the next request."""
        if isinstance(exc, Exception):
            slot.error = exc if isinstance(exc, HearthError) else HearthError(f"{type(exc).__name__}: {exc}")
        file_fault = isinstance(exc, ModelLoadError) and (self.blame_file if exc.file_fault is None
                                                          else exc.file_fault)
        if file_fault and not slot.path.startswith(REMOTE_PREFIX):  # a remote: again
            slot.state, slot.error_stamp = "failed", file_stamp(slot.path)
        else:
            slot.state, slot.error_stamp = "unloaded", None
            log.warning("loading model %s failed (tried again on the next request): %s", slot.key, exc)

    def _lease(self, slot: _Slot, keep_alive_s: Optional[float]) -> Lease:
        # A request's keep_alive holds for its own lease only: one without it (None) is back on the model's
        # default TTL, as Ollama treats a missing keep_alive (one keep_alive 0 used to unload the model after
        # every later request). The last lease given back decides the idle time after it (``_release``).
        slot.leases += 1
        slot.last_used = self._clock()
        slot.keep_alive_s = keep_alive_s
        return Lease(self, slot, keep_alive_s)

    def pin(self, name: Optional[str]) -> str:
        """Load ``name`` now and keep it loaded while idle until the budget needs its room (``hearth serve
        --model``'s preload): its default TTL becomes "never"; a request's own keep_alive (0 included) still
        holds for that request's lease. Returns the model id; raises as ``acquire``."""
        lease = self.acquire(name)
        with self._cond:
            lease._slot.pinned = True
        lease.release()
        return lease.model_id

    def _wait(self, deadline: float, why: str) -> None:
        left = deadline - self._clock()
        if left <= 0:
            raise ModelBusy(why)
        self._cond.wait(min(left, 1.0))

    def _load(self, slot: _Slot, deadline: float) -> tuple[Any, int]:
        """Make room for ``slot`` (evicting idle models), then create and load its engine (outside the lock)."""
        need = int(self._estimate(slot.key, slot.path))
        if self.budget_bytes is not None and need > self.budget_bytes:
            raise ModelLoadError(f"model {slot.key!r} needs about {need / GIB:.2f} GiB (memory estimate), more "
                                 f"than the models' budget of {self.budget_bytes / GIB:.2f} GiB", path=slot.path,
                                 file_fault=True)  # the file's size against a fixed budget: the same next time
        victims = self._make_room(slot, need, deadline)
        for victim, engine in victims:
            self._close(victim, engine, "evicted for " + slot.key)
        t0 = time.perf_counter()
        engine = self._make(slot.key, slot.path)
        try:
            engine.load()
        except BaseException:
            try:
                engine.close()
            except Exception:  # noqa: BLE001 - the load error is the one to report
                log.exception("closing an engine whose load failed")
            raise
        slot.load_s = time.perf_counter() - t0
        slot.loads += 1
        return engine, need

    def _make_room(self, slot: _Slot, need: int, deadline: float) -> list[tuple[_Slot, Any]]:
        """Unload idle models, least recently used first, until ``need`` bytes fit beside the loaded and loading
        ones; wait for busy ones to go idle (bounded). Returns what to close (outside the lock)."""
        if self.budget_bytes is None:
            return []
        victims = []
        with self._cond:
            while True:
                used = sum(s.need_bytes for s in self._slots.values()
                           if s.state == "loaded" or (s.state == "loading" and s is not slot))
                if used + need <= self.budget_bytes:
                    slot.need_bytes = need  # counted while it loads, so two loads do not overcommit
                    return victims
                idle = sorted((s for s in self._slots.values() if s.state == "loaded" and s.leases == 0),
                              key=lambda s: s.last_used)
                if idle:
                    victim = idle[0]
                    victims.append((victim, victim.engine))
                    victim.state, victim.engine, victim.need_bytes = "unloaded", None, 0
                    continue
                busy = ", ".join(sorted(s.key for s in self._slots.values() if s.state in ("loaded", "loading")
                                        and s is not slot))
                try:
                    self._wait(deadline, f"model {slot.key!r} (about {need / GIB:.2f} GiB) does not fit in the "
                                         f"models' budget of {self.budget_bytes / GIB:.2f} GiB while {busy} "
                                         f"{'is' if ',' not in busy else 'are'} busy")
                except ModelBusy:
                    slot.need_bytes = 0
                    raise

    def _release(self, slot: _Slot, keep_alive_s: Optional[float] = None) -> None:
        with self._cond:
            slot.leases -= 1
            slot.last_used = self._clock()
            slot.keep_alive_s = keep_alive_s
            self._cond.notify_all()
            close = slot.leases == 0 and slot.state == "loaded" and self._ttl(slot) == 0
            engine = slot.engine
            if close:
                slot.state, slot.engine, slot.need_bytes = "unloaded", None, 0
        if close:
            self._close(slot, engine, "keep_alive 0")

    # -- time to live ---------------------------------------------------------------------------------
    def _ttl(self, slot: _Slot) -> Optional[float]:
        """Idle seconds before ``slot`` unloads (the last lease's keep_alive, else never for a pinned model, else
        its own TTL, else the pool's); None: never."""
        ttl = slot.keep_alive_s
        if ttl is None and slot.pinned:
            return None
        if ttl is None:
            ttl = self._ttl_for(slot.key)
        if ttl is None:
            ttl = self.ttl_s
        return None if ttl is None or ttl < 0 else ttl

    def reap(self) -> list[str]:
        """Unload every idle model whose time to live has passed; returns their ids (the reaper calls this)."""
        now = self._clock()
        out = []
        with self._cond:
            for s in self._slots.values():
                ttl = self._ttl(s)
                if s.state == "loaded" and s.leases == 0 and ttl is not None and now - s.last_used >= ttl:
                    out.append((s, s.engine))
                    s.state, s.engine, s.need_bytes = "unloaded", None, 0
            if out:
                self._cond.notify_all()
        for s, engine in out:
            self._close(s, engine, "idle past its time to live")
        return [s.key for s, _ in out]

    def _reap_loop(self, interval: float) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
            time.sleep(interval)
            try:
                self.reap()
            except Exception:  # noqa: BLE001 - the reaper must keep running
                log.exception("model pool reaper")

    def _close(self, slot: _Slot, engine: Optional[Backend], why: str) -> None:
        log.info("unloading model %s (%s)", slot.key, why)
        self.unloads.append((slot.key, why))
        del self.unloads[:-100]
        try:
            if engine is not None:
                engine.close()
        except Exception:  # noqa: BLE001 - an engine that fails to close is gone anyway
            log.exception("closing model %s", slot.key)
        with self._cond:
            self._cond.notify_all()

    # -- the rest -------------------------------------------------------------------------------------
    def unload(self, name: str) -> bool:
        """Unload model ``name`` now if it is loaded and idle. True when it was unloaded."""
        key, _path = self._resolve(name)
        with self._cond:
            slot = self._slots.get(key)
            if slot is None or slot.state != "loaded" or slot.leases:
                return False
            engine = slot.engine
            slot.state, slot.engine, slot.need_bytes = "unloaded", None, 0
        self._close(slot, engine, "asked")
        return True

    def engine_if_loaded(self, name: Optional[str]) -> Any:
        """The engine of ``name`` when it is loaded, else None (no load, no lease)."""
        key, _path = self._resolve(name)
        with self._cond:
            slot = self._slots.get(key)
            return slot.engine if slot is not None and slot.state == "loaded" else None

    def status(self) -> dict[str, dict[str, Any]]:
        """Per model id the pool has seen: ``state``, ``loaded``, ``memory_bytes`` (its estimate), ``leases``
        (requests holding it), ``idle_s``, ``ttl_s`` (None: never unloads idle), ``loads`` (times loaded),
        ``load_s`` (the last load's seconds), ``error`` (the last load error, or None)."""
        now = self._clock()
        with self._cond:
            return {k: {"state": s.state, "loaded": s.state == "loaded", "memory_bytes": s.need_bytes or None,
                        "leases": s.leases, "idle_s": (now - s.last_used) if s.state == "loaded" else None,
                        "ttl_s": self._ttl(s), "loads": s.loads, "load_s": s.load_s,
                        "error": str(s.error) if s.error else None} for k, s in self._slots.items()}

    def load_error(self, name: Optional[str] = None) -> Optional[HearthError]:
        """The last load error of the model ``name`` names (None: the default model), or None when its last
        load succeeded or was never tried (``ModelNotFound`` for an unknown name). For /health: a model that
        cannot load."""
        key, _path = self._resolve(name)
        with self._cond:
            slot = self._slots.get(key)
            return slot.error if slot is not None else None

    def load_errors(self) -> dict[str, dict[str, Any]]:
        """Per model id whose last load failed: ``error`` (the message), ``type`` (the error's class name),
        ``retry``: ``"next request"``, or ``"when the file changes"`` when the file caused it (remembered)."""
        with self._cond:
            return {k: {"error": str(s.error), "type": type(s.error).__name__,
                        "retry": "when the file changes" if s.state == "failed" else "next request"}
                    for k, s in self._slots.items() if s.error is not None}

    def used_bytes(self) -> int:
        """The memory estimates of the loaded (and loading) models, in bytes."""
        with self._cond:
            return sum(s.need_bytes for s in self._slots.values() if s.state in ("loaded", "loading"))

    def close(self) -> None:
        """Unload every model (waiting for nothing: running requests on them fail) and stop the reaper."""
        with self._cond:
            self._closed = True
            out = [(s, s.engine) for s in self._slots.values() if s.engine is not None]
            for s, _ in out:
                s.state, s.engine, s.need_bytes = "unloaded", None, 0
            self._cond.notify_all()
        for s, engine in out:
            self._close(s, engine, "pool closed")


def local_pool(make_backend: Callable[[str, str], Backend], load_for: Callable[[str], LoadSettings], *,
               remote_names: Sequence[str] = (), ttl_for: Callable[[str], Optional[float]] = lambda key: None,
               budget_bytes: Optional[int] = None, ttl_s: Optional[float] = 300.0,
               load_timeout_s: float = 300.0) -> ModelPool:
    """A pool of the installed GGUF models (names resolved by ``registry.resolve_model``) and the remote engines
    ``remote_names`` (their path is ``REMOTE_PREFIX + name``). Settings-free: ``make_backend(model_id, path)``
    builds a new, unloaded backend (``app.backends.model_pool`` passes the one settings → backend factory);
    ``load_for(model_id)``: the ``LoadSettings`` it loads with, for its memory estimate (bytes, from the file's
    GGUF metadata; a remote needs 0 here); ``ttl_for(model_id)``: its idle TTL in seconds or None for
    ``ttl_s``. ``budget_bytes`` None: 80 % of the RAM available now (``memory_estimate.detect_available_ram``;
    no limit when unknown). A file that cannot be inspected raises ``ModelLoadError`` when it is acquired."""
    from app.catalog.gguf import inspect_model
    from app.catalog.memory_estimate import detect_available_ram, estimate_memory, resolve_parallel
    from app.catalog.registry import model_id, resolve_model

    remotes = tuple(remote_names)

    def resolve(name: Optional[str]) -> tuple[str, str]:
        if name and name in remotes:
            return name, REMOTE_PREFIX + name
        # A bare name is an installed model, never a file in the working directory; a path (the default
        # model's, ``hearth serve --model PATH``) is allowed: the port refuses clients' names with separators.
        path = resolve_model(name, allow_paths=bool(name) and ("/" in name or "\\" in name))
        return model_id(path), str(path)

    def estimate(key: str, path: str) -> int:
        if path.startswith(REMOTE_PREFIX):
            return 0  # it runs on the remote machine
        try:
            info = inspect_model(Path(path))
        except HearthError as exc:  # the file fails inspection: its fault, unless it could not be read
            raise ModelLoadError(str(exc), path=path, file_fault=not isinstance(exc.__cause__, OSError)) from None
        return estimate_memory(info, resolve_parallel(info, load_for(key)), detect_ram=False).total_bytes

    if budget_bytes is None:
        ram = detect_available_ram()
        budget_bytes = int(ram * 0.8) if ram else None
    pool = ModelPool(resolve, make_backend, estimate, budget_bytes=budget_bytes, ttl_s=ttl_s, ttl_for=ttl_for,
                     load_timeout_s=load_timeout_s, blame_file=False)
    pool.remote_names = remotes  # names that are remote engines, not files (for the port's listing)
    return pool
