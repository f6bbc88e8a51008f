"""``ChatController``: one chat turn at a time, run as a generator on a worker.

A turn (``run_turn``) retrieves evidence for the message when documents are chosen, runs
``ChatSession.stream`` / ``regenerate`` (which stores the user message, the streamed answer and its final
status; see docs/memory.md), then parses ``[E:id]`` citations out of the answer and stores them. Events reach
the GUI as ``("evidence", [...])`` and ``("delta", text)`` items; the ``TurnResult`` comes last.

Stop cancels the engine ``Generation`` directly (``EngineAdapter.cancel``), so it works during a long prefill
too, when no item is flowing that a ``quit()`` flag could be checked against. The partial answer is kept in
the store with status ``error`` (``meta.error = "Cancelled"``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.engine.types import DecodingParams, Delta, GenerateRequest
from app.ui.workers import GeneratorWorker, WorkerPool

log = logging.getLogger(__name__)

Retrieve = Callable[[str, str], list]  # (conversation id, query) -> list[Evidence]


def decoding_options(d: DecodingParams) -> dict:
    """Sampling defaults as ``generate_fn`` options (max_tokens is ChatSession's own argument)."""
    skip = {"max_tokens", "stop", "logit_bias", "grammar"}
    return {f.name: getattr(d, f.name) for f in fields(d) if f.name not in skip}


class EngineAdapter:
    """``generate_fn`` for ``ChatSession`` over an ``Engine``; remembers the running ``Generation`` so that
    ``cancel()`` (GUI thread) stops it."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.current: Any = None
        self.cancelled = False

    def generate(self, messages: list, max_tokens: int | None = None, **opts: Any) -> Iterator[Any]:
        req = GenerateRequest(messages=tuple(messages), decoding=DecodingParams.make(max_tokens=max_tokens, **opts))
        gen = self.engine.generate(req)
        self.current = gen
        if self.cancelled:
            gen.cancel()
        try:
            yield from gen
        finally:
            gen.close()
            self.current = None

    def cancel(self) -> None:
        self.cancelled = True
        gen = self.current
        if gen is not None:
            gen.cancel()


def make_session(store: Any, engine: Any, adapter: EngineAdapter, user: Any) -> Any:
    from app.memory.chat_session import ChatSession

    return ChatSession(store, adapter.generate, engine.count_tokens, n_ctx=engine.settings.n_ctx,
                       max_tokens=user.decoding.max_tokens or 256, system_prompt=user.system_prompt,
                       model=Path(str(engine.model_path)).stem, settings=engine.settings.to_dict(),
                       generate_options=decoding_options(user.decoding), summary_options={"temperature": 0.2})


def run_turn(store: Any, engine: Any, adapter: EngineAdapter, user: Any, conversation_id: str, text: str | None,
             *, parent_id: str | None = None, edit: bool = False, regenerate_of: str | None = None,
             retrieve: Retrieve | None = None) -> Iterator[Any]:
    """One turn on a worker thread (see the module docstring). Returns a dict: result, evidence, citations."""
    from app.memory.chat_session import TurnResult

    session = make_session(store, engine, adapter, user)
    query = text if regenerate_of is None else store.get_message(regenerate_of).content
    evidence = retrieve(conversation_id, query) if retrieve else []
    if evidence:
        yield ("evidence", evidence)
    block = _evidence_block(evidence)
    if regenerate_of is not None:
        stream = session.regenerate(conversation_id, regenerate_of, evidence=block)
    else:
        if edit and parent_id is None:
            store.set_current(conversation_id, None)  # editing the first message: a new first message
        stream = session.stream(conversation_id, text, parent_id=parent_id, evidence=block)
    result = None
    for item in stream:
        if isinstance(item, TurnResult):
            result = item
        elif isinstance(item, Delta) and item.text:
            yield ("delta", item.text)
    citations = _store_citations(store, result, evidence)
    return {"result": result, "evidence": evidence, "citations": citations}


def _evidence_block(evidence: list) -> str | None:
    if not evidence:
        return None
    from app.retrieval.rag import format_evidence_block

    return format_evidence_block(evidence)


def _store_citations(store: Any, result: Any, evidence: list) -> list[dict]:
    if not evidence or result is None:
        return []
    from app.retrieval.rag import parse_citations

    cites = [{"evidence_id": c.evidence_id, "path": c.path, "page": c.page, "quote": c.quote}
             for c in parse_citations(result.text, evidence)]
    if cites:
        store.add_citations(result.message_id, cites)
    return cites


class ChatController(QObject):
    """Signals: ``busy_changed(bool)``, ``evidence(list)``, ``delta(str)``, ``finished(dict)`` (see
    ``run_turn``), ``failed(exc)`` (``Cancelled`` when stopped)."""

    busy_changed = Signal(bool)
    evidence = Signal(list)
    delta = Signal(str)
    finished = Signal(dict)
    failed = Signal(object)

    def __init__(self, pool: WorkerPool, store: Any, engine_ctl: Any, settings_fn: Callable[[], Any],
                 retrieve: Retrieve | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pool, self.store, self.engine_ctl = pool, store, engine_ctl
        self.settings_fn, self.retrieve = settings_fn, retrieve
        self._worker: GeneratorWorker | None = None
        self._adapter: EngineAdapter | None = None

    @property
    def busy(self) -> bool:
        return self._worker is not None

    def send(self, conversation_id: str, text: str, *, parent_id: str | None = None, edit: bool = False) -> bool:
        return self._start(conversation_id, text, parent_id=parent_id, edit=edit)

    def regenerate(self, conversation_id: str, user_message_id: str) -> bool:
        return self._start(conversation_id, None, regenerate_of=user_message_id)

    def _start(self, conversation_id: str, text: str | None, **kw: Any) -> bool:
        engine = self.engine_ctl.current()
        if engine is None or self.busy:
            return False
        self._adapter = EngineAdapter(engine)
        worker = GeneratorWorker(run_turn, self.store, engine, self._adapter, self.settings_fn(), conversation_id,
                                 text, retrieve=self.retrieve, **kw)
        self._worker = worker
        self.busy_changed.emit(True)
        self.pool.start(worker, on_yield=self._item, on_return=self.finished.emit, on_error=self.failed.emit,
                        on_finish=self._done)
        return True

    def _item(self, item: tuple) -> None:
        kind, payload = item
        (self.delta if kind == "delta" else self.evidence).emit(payload)

    def _done(self) -> None:
        self._worker = self._adapter = None
        self.busy_changed.emit(False)

    def stop(self) -> None:
        """Stop the answer being written (within one token or one prefill chunk)."""
        if self._adapter is not None:
            self._adapter.cancel()
        if self._worker is not None:
            self._worker.quit()
