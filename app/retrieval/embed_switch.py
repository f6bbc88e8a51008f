"""Choosing the embedding model and moving the library to it: which model search uses (``active``), which one
the library is being re-embedded into (``pending``), and the re-embed itself, resumable and switched
atomically at the end. docs/retrieval.md, "Embedding models"."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import HearthError, ModelLoadError
from app.retrieval.embedder import POOLING_TYPES, check_pooling, model_id_for

log = logging.getLogger(__name__)

REEMBED_BATCH = 64  # chunks embedded and committed together: what an interruption loses at most


@dataclass(frozen=True)
class ModelRef:
    """An embedding model as Hearth uses it: ``model_id`` (``embedder.model_id_for``: file identity and
    pooling), the GGUF ``path`` and the ``pooling`` override (None: the model's own)."""

    model_id: str
    path: str
    pooling: str | None = None

    @classmethod
    def of(cls, path: Path | str, pooling: str | None = None) -> ModelRef:
        """The reference of the file ``path`` (reads its first and last MiB). Raises ``OSError``."""
        p = Path(path).expanduser().resolve()
        return cls(model_id_for(p, check_pooling(pooling)), str(p), pooling)

    @property
    def name(self) -> str:
        """The file's name, with the pooling override: ``gemma-3-270m-q4_k_m.gguf (mean pooling)``."""
        return Path(self.path).name + (f" ({self.pooling} pooling)" if self.pooling else "")


@dataclass(frozen=True)
class SwitchState:
    """What the store records (``embedding_models``): ``active`` and ``pending`` model, and ``failed``:
    ``(model id, reason)`` of the last re-embed that failed, or None."""

    active: ModelRef | None = None
    pending: ModelRef | None = None
    failed: tuple[str, str] | None = None


# The actions of ``plan``.
KEEP, ADOPT, START, RESUME, RESTART, CANCEL, BLOCKED = ("keep", "adopt", "start", "resume", "restart", "cancel",
                                                       "blocked")


def plan(state: SwitchState, desired: ModelRef | None, active_has_vectors: bool) -> str:
    """What to do to bring the library to the ``desired`` model (None: none is installed). Pure.

    ``keep``: nothing (no model wanted, or it is the active one with nothing pending); ``cancel``: the active
    one is wanted again while another is pending: drop the pending one; ``adopt``: make ``desired`` active at
    once, since there are no vectors to keep searching on (an empty library, or one never embedded);
    ``blocked``: its last re-embed failed (shown with the reason until it is chosen again); ``resume``: it is
    the pending one: go on; ``restart``: another one is pending: drop it and start this one; ``start``:
    re-embed the library into it while search stays on the active one."""
    if desired is None:
        return KEEP
    if state.active is not None and state.active.model_id == desired.model_id:
        return CANCEL if state.pending is not None else KEEP
    if state.active is None or not active_has_vectors:
        return ADOPT
    if state.failed is not None and state.failed[0] == desired.model_id:
        return BLOCKED
    if state.pending is not None:
        return RESUME if state.pending.model_id == desired.model_id else RESTART
    return START


def read_state(store: Any) -> SwitchState:
    """The ``SwitchState`` recorded in ``store`` (a ``DocumentStore``)."""
    roles = store.embedding_roles()

    def ref(role: str) -> ModelRef | None:
        r = roles.get(role)
        return ModelRef(r["model"], r["path"] or "", r["pooling"]) if r else None

    failed = roles.get("failed")
    return SwitchState(ref("active"), ref("pending"), (failed["model"], failed["reason"] or "") if failed else None)


def _record(store: Any, role: str, ref: ModelRef, reason: str | None = None) -> None:
    store.set_embedding_role(role, ref.model_id, ref.path, ref.pooling, reason)


def reconcile(store: Any, desired: ModelRef | None, default: ModelRef | None = None) -> tuple[str, SwitchState]:
    """Apply ``plan`` to ``store`` for ``desired`` and return ``(action, state after)``. A store indexed
    before m010 (no ``active`` row) first takes ``default`` (the bundled model) as active when it holds
    vectors of it. ``adopt`` / ``cancel`` / ``restart`` / ``start`` are recorded here; ``resume`` and
    ``start`` / ``restart`` leave a pending model for ``reembed`` to finish."""
    state = read_state(store)
    if state.active is None and default is not None and store.has_vectors(default.model_id):
        _record(store, "active", default)
        state = read_state(store)
    has = state.active is not None and store.has_vectors(state.active.model_id)
    action = plan(state, desired, has)
    if action == ADOPT:
        _record(store, "active", desired)
        store.clear_embedding_role("pending")
        store.clear_embedding_role("failed")
        store.drop_vectors_except([desired.model_id])
    elif action == CANCEL:
        store.clear_embedding_role("pending")
        store.drop_vectors_except([state.active.model_id])
    elif action in (START, RESTART):
        store.clear_embedding_role("failed")
        _record(store, "pending", desired)
        store.drop_vectors_except([state.active.model_id, desired.model_id])
    return action, read_state(store)


def choose(store: Any, desired: ModelRef, default: ModelRef | None = None) -> tuple[str, SwitchState]:
    """The person chose ``desired``: forget an earlier failure of it (choosing it again is the retry), then
    ``reconcile``."""
    state = read_state(store)
    if state.failed is not None and state.failed[0] == desired.model_id:
        store.clear_embedding_role("failed")
    return reconcile(store, desired, default)


# ------------------------------------------------------------------------------------------------ checking

def check_model_file(path: Path | str, pooling: str | None = None) -> tuple[ModelRef, Any]:
    """Validate a GGUF file as an embedding model; ``(ModelRef, ModelInfo)``. Raises ``ModelLoadError``
    naming the problem: no such file, not a readable GGUF (``app.catalog.gguf.inspect_model``'s reasons), or
    a model without pooling (a chat model) when no ``pooling`` override is given; ``InvalidRequest`` for an
    unknown ``pooling``."""
    from app.catalog.gguf import inspect_model

    check_pooling(pooling)
    p = Path(path).expanduser()
    if not p.is_file():
        raise ModelLoadError(f"{p}: no such file", path=str(p))
    info = inspect_model(p)
    if not info.is_embedding_model and pooling is None:
        raise ModelLoadError(
            f"{p.name}: this is a chat model ({info.architecture}) with no pooling type, not an embedding model; "
            f"choose an embedding model, or give a pooling ({', '.join(POOLING_TYPES)}) to use it as one anyway",
            path=str(p))
    if info.pooling_type == 0 and pooling is None:  # LLAMA_POOLING_TYPE_NONE: one vector per token
        raise ModelLoadError(f"{p.name}: the model's pooling type is 'none' (a vector per token); give a "
                             f"pooling ({', '.join(POOLING_TYPES)})", path=str(p))
    return ModelRef.of(p, pooling), info


def default_ref() -> ModelRef | None:
    """The bundled default (all-MiniLM-L6-v2) when it is installed, else None."""
    from app.retrieval.embed_model import find_embedding_model

    path = find_embedding_model()
    return ModelRef.of(path) if path is not None else None


def desired_ref(settings: Any) -> ModelRef | None:
    """The model ``settings`` (a ``UserSettings``) asks for: ``embedding_model`` (a file) with
    ``embedding_pooling``, else the default; None when that file is gone (logged) or none is installed."""
    chosen = getattr(settings, "embedding_model", None)
    if not chosen:
        return default_ref()
    try:
        return ModelRef.of(chosen, getattr(settings, "embedding_pooling", None))
    except (OSError, HearthError) as exc:
        log.warning("the chosen embedding model %s cannot be read (%s); search stays on the current one",
                    chosen, exc)
        return None


def active_ref(store: Any) -> ModelRef | None:
    """The model search should embed queries with: the store's active one when its file is there, else (a
    store never switched) the default."""
    state = read_state(store)
    if state.active is not None:
        if Path(state.active.path).is_file():
            return state.active
        log.warning("the active embedding model %s is gone; keyword search only", state.active.path)
        return None
    return default_ref()


def no_model_notice(store: Any) -> str:
    """Why search has no embedding model, said to a person: the file of the model the library is embedded
    with (the store's active one) is gone, with the way back to the bundled default; or none is installed."""
    active = read_state(store).active
    if active is not None and not Path(active.path).is_file():
        return (f"the embedding model search uses ({active.path}) is gone: keyword search (BM25) only; put the "
                "file back, or re-embed with the bundled model: `hearth ingest --embedding-model default`")
    return "no embedding model installed: keyword search (BM25) only; run `hearth setup`"


def embedder_for(ref: ModelRef | None, **kw: Any) -> Any:
    """An ``Embedder`` on ``ref`` (None for None); ``kw`` go to ``Embedder``."""
    if ref is None:
        return None
    from app.retrieval.embedder import Embedder

    return Embedder(ref.path, pooling=ref.pooling, **kw)


# ------------------------------------------------------------------------------------------------ re-embed

@dataclass
class ReembedProgress:
    """One re-embed's progress: ``model`` (the pending model's name), ``done`` of ``total`` items of the step
    ``counting`` ("chunks": chunk vectors; "leads": passage-lead vectors, the second step; ``total`` grows
    when documents are added meanwhile), ``rate`` (items per second of this step in this run, None before
    its first batch), ``phase`` ("chunks", "leads", "switched", "stopped", "failed") and ``reason`` (when
    failed)."""

    model: str
    done: int = 0
    total: int = 0
    rate: float | None = None
    phase: str = "chunks"
    reason: str | None = None
    counting: str = "chunks"

    def text(self) -> str:
        """One line: "Re-embedding for X: 120 / 480 chunks · 35 chunks/s", or how it ended."""
        if self.phase == "switched":
            return f"Search now uses {self.model}."
        if self.phase == "failed":
            return f"Re-embedding for {self.model} failed: {self.reason}. Search stays on the current model."
        what = "passage leads" if self.counting == "leads" else "chunks"
        rate = f" · {self.rate:,.1f} {what.split()[-1]}/s" if self.rate else ""
        head = "Re-embedding paused" if self.phase == "stopped" else "Re-embedding"
        return f"{head} for {self.model}: {self.done:,} / {self.total:,} {what}{rate}"


def reembed(store: Any, embedder: Any, stop: threading.Event | None = None,
            progress: Callable[[ReembedProgress], None] | None = None, *, leads: bool = True,
            batch: int = REEMBED_BATCH) -> ReembedProgress:
    """Give every chunk (and, with ``leads``, every lead) a vector of the pending model, which ``embedder``
    runs, batch by batch, each committed; then ``store.switch_active``. Documents written meanwhile are
    picked up before the switch. ``stop`` set: returns after the batch in flight (phase "stopped"; the next
    call resumes). An embedding failure records ``failed`` with the reason, drops the pending model's
    vectors and returns phase "failed": search stays on the active model. Raises ``ValueError`` when
    ``embedder.model_id`` is not the pending model, ``StoreError``."""
    state = read_state(store)
    if state.pending is None or state.pending.model_id != embedder.model_id:
        raise ValueError(f"{embedder.model_id} is not the pending embedding model")
    model = embedder.model_id
    p = ReembedProgress(state.pending.name)
    clock = {"started": time.monotonic(), "embedded": 0}  # of the step being counted

    def report(phase: str) -> None:
        if phase in ("chunks", "leads") and phase != p.counting:
            p.counting, clock["started"], clock["embedded"] = phase, time.monotonic(), 0
        elif phase == "switched":
            p.counting = "chunks"  # how it ended: every chunk has the new vector
        p.phase = phase
        if p.counting == "leads":
            p.done, p.total = store.lead_counts(model)
        else:
            p.total = store.stats()["chunks"]
            p.done = p.total - store.missing_vectors(model)
        elapsed = time.monotonic() - clock["started"]
        p.rate = clock["embedded"] / elapsed if clock["embedded"] and elapsed > 0 else None
        if progress is not None:
            progress(p)

    steps = [("chunks", store.chunks_without_vectors, lambda ids, _t, v: store.add_vectors(model, ids, v))]
    if leads:
        steps.append(("leads", store.chunks_without_leads,
                      lambda ids, t, v: store.add_lead_vectors(model, ids, t, v)))
    try:
        while True:
            for phase, find, add in steps:
                report(phase)
                while todo := find(model, limit=batch):
                    if stop is not None and stop.is_set():
                        report("stopped")
                        return p
                    add([c for c, _ in todo], [t for _, t in todo], embedder.embed([t for _, t in todo]))
                    clock["embedded"] += len(todo)
                    report(phase)
            if store.switch_active(model):
                report("switched")
                return p
    except HearthError as exc:
        return _failed(store, state.pending, p, exc, progress)


def _failed(store: Any, ref: ModelRef, p: ReembedProgress, exc: HearthError,
            progress: Callable[[ReembedProgress], None] | None) -> ReembedProgress:
    """Record the failure, drop the failed model's vectors; search stays on the active model."""
    from app.errors import StoreError

    if isinstance(exc, StoreError):
        raise exc
    log.warning("re-embedding for %s failed: %s", ref.model_id, exc)
    active = read_state(store).active
    _record(store, "failed", ref, str(exc))
    store.clear_embedding_role("pending")
    store.drop_vectors_except([active.model_id] if active else [])
    p.phase, p.reason = "failed", str(exc)
    if progress is not None:
        progress(p)
    return p
