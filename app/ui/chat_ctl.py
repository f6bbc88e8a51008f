"""``ChatController``: one chat turn at a time, run on a worker, over the turn pipeline (``app.assistant``).

The window's only part in a turn is showing its events: the worker iterates ``Assistant.turn`` and forwards
``EvidenceFound`` as ``evidence(list[dict])`` and ``TextDelta`` as ``delta(str)``; ``TurnDone`` comes last as
``finished``. Retrieval (limited to the conversation's chosen documents), storing and citations happen in
the pipeline, exactly as for ``hearth chat`` and the port. The window's turns are ``Caller.WINDOW``'s
(priority 1): the engine admits them before API requests waiting for a slot.

Stop cancels the engine ``Generation`` directly (``Assistant.cancel``), so it works during a long prefill
too, when no item is flowing that a ``quit()`` flag could be checked against. The partial answer is kept in
the store with status ``error`` (``meta.error = "Cancelled"``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.assistant import Assistant, Caller, EvidenceFound, TextDelta, TurnDone, given
from app.errors import Cancelled
from app.ui.workers import GeneratorWorker, WorkerPool

log = logging.getLogger(__name__)


def run_turn(assistant: Assistant, conversation_id: str, text: str | None, **kw: Any) -> Iterator[tuple]:
    """The worker's generator: ``("evidence", [dict])`` and ``("delta", text)`` items; returns the
    ``TurnDone``."""
    done = None
    for item in assistant.turn(conversation_id, text, **kw):
        if isinstance(item, EvidenceFound):
            yield ("evidence", given(item.evidence))
        elif isinstance(item, TextDelta):
            yield ("delta", item.text)
        elif isinstance(item, TurnDone):
            done = item
    return done


class ChatController(QObject):
    """Signals: ``busy_changed(bool)``, ``evidence(list[dict])``, ``delta(str)``, ``finished(TurnDone)``,
    ``failed(exc)`` (``Cancelled`` when stopped). ``documents()``: the ``DocumentSource`` turns search (None:
    no documents)."""

    busy_changed = Signal(bool)
    evidence = Signal(list)
    delta = Signal(str)
    finished = Signal(object)
    failed = Signal(object)

    def __init__(self, pool: WorkerPool, store: Any, engine_ctl: Any, settings_fn: Callable[[], Any],
                 documents: Callable[[], Any] | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pool, self.store, self.engine_ctl = pool, store, engine_ctl
        self.settings_fn, self.documents = settings_fn, documents
        self._worker: GeneratorWorker | None = None
        self._assistant: Assistant | None = None

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
        user = self.settings_fn()
        docs = self.documents() if self.documents is not None else None
        self._assistant = Assistant(engine, self.store, decoding=user.decoding, system_prompt=user.system_prompt,
                                    documents=docs, caller=Caller.WINDOW)
        worker = GeneratorWorker(run_turn, self._assistant, conversation_id, text, **kw)
        self._worker = worker
        self.busy_changed.emit(True)
        self.pool.start(worker, on_yield=self._item, on_return=self._returned, on_error=self.failed.emit,
                        on_finish=self._done)
        return True

    def _item(self, item: tuple) -> None:
        kind, payload = item
        (self.delta if kind == "delta" else self.evidence).emit(payload)

    def _returned(self, done: Any) -> None:
        """The worker's result: the ``TurnDone``, or None when Stop closed the turn before it ended (then the
        turn failed as ``Cancelled``, whichever of the two stops got there first)."""
        if isinstance(done, TurnDone):
            self.finished.emit(done)
        else:
            self.failed.emit(Cancelled("stopped by the person"))

    def _done(self) -> None:
        self._worker = self._assistant = None
        self.busy_changed.emit(False)

    def stop(self) -> None:
        """Stop the answer being written (within one token or one prefill chunk)."""
        if self._assistant is not None:
            self._assistant.cancel()
        if self._worker is not None:
            self._worker.quit()
