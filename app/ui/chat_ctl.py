"""``ChatController``: one chat turn at a time, run on a worker, over the turn pipeline (``app.assistant``).

The window's only part in a turn is showing its events: the worker iterates ``Assistant.turn`` and forwards
``EvidenceFound`` as ``evidence(list[dict])`` and ``TextDelta`` as ``delta(str)``; ``TurnDone`` comes last as
``finished``. Retrieval (limited to the conversation's chosen documents), storing and citations happen in
the pipeline, exactly as for ``hearth chat`` and the port. The window's turns are ``Caller.WINDOW``'s
(priority 1): the engine admits them before API requests waiting for a slot.

The reasoning: docs/ui.md, 'app/ui/chat_ctl.py'.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.assistant import (
    Assistant,
    Caller,
    EvidenceFound,
    Permission,
    ReasoningDelta,
    TextDelta,
    ToolCallRequested,
    ToolNotice,
    ToolResultShown,
    TurnDone,
    given,
)
from app.catalog.registry import model_id
from app.errors import Cancelled, InvalidRequest
from app.protocol.reasoning import SETTING_KEYS, ReasoningSettings
from app.ui.workers import GeneratorWorker, WorkerPool

log = logging.getLogger(__name__)


def run_turn(assistant: Assistant, conversation_id: str, text: str | None, **kw: Any) -> Iterator[tuple]:
    """The worker's generator: ``("evidence", [dict])``, ``("reasoning", text)``, ``("delta", text)``,
    ``("tool_call", request)``, ``("tool_result", shown)`` and ``("tool_notice", text)`` items; returns the
    ``TurnDone``."""
    done = None
    for item in assistant.turn(conversation_id, text, **kw):
        if isinstance(item, EvidenceFound):
            yield ("evidence", given(item.evidence))
        elif isinstance(item, ReasoningDelta):
            yield ("reasoning", item.text)
        elif isinstance(item, TextDelta):
            yield ("delta", item.text)
        elif isinstance(item, ToolCallRequested):
            yield ("tool_call", item)
        elif isinstance(item, ToolResultShown):
            yield ("tool_result", item)
        elif isinstance(item, ToolNotice):
            yield ("tool_notice", item.text)
        elif isinstance(item, TurnDone):
            done = item
    return done


def model_reasoning_default(settings: Any, model: str) -> ReasoningSettings:
    """The model's default reasoning layer from the user settings (``per_model[model]``'s reasoning keys;
    a value that does not validate is logged and left out)."""
    over = (getattr(settings, "per_model", None) or {}).get(model) or {}
    layer = {k: v for k, v in over.items() if k in SETTING_KEYS}
    try:
        return ReasoningSettings.from_mapping(layer, "model")
    except InvalidRequest as exc:
        log.warning("settings.json per_model[%r]: %s; the model's reasoning default is not used", model, exc)
        return ReasoningSettings()


def chat_setup(store: Any, conversation_id: str, user: Any) -> tuple[Any, str]:
    """The decoding settings and system prompt of a conversation's next turn: its preset (its own, else its
    project's) over the person's defaults, and its own system prompt, else the preset's, else the default
    (``Store.setup``). A preset's decoding that no longer validates is logged and the defaults are used."""
    setup = store.setup(conversation_id)
    decoding = user.decoding
    if setup.preset is not None:
        try:
            decoding = setup.preset.decoding_over(user.decoding)
        except InvalidRequest as exc:
            log.warning("preset %r: %s; using the default decoding settings", setup.preset.name, exc)
    prompt = setup.system_prompt if setup.system_prompt is not None else user.system_prompt
    return decoding, prompt


class ChatController(QObject):
    """Signals: ``busy_changed(bool)``, ``evidence(list[dict])``, ``reasoning(str)``, ``delta(str)``,
    ``tool_call(request)``,
    ``tool_result(shown)``, ``tool_notice(str)``, ``finished(TurnDone)``, ``failed(exc)`` (``Cancelled`` when
    stopped). ``documents()``: the ``DocumentSource`` turns search (None: no documents); ``tools``: the
    ``ToolsController`` (None: no tools)."""

    busy_changed = Signal(bool)
    evidence = Signal(list)
    reasoning = Signal(str)
    delta = Signal(str)
    tool_call = Signal(object)
    tool_result = Signal(object)
    tool_notice = Signal(str)
    finished = Signal(object)
    failed = Signal(object)

    def __init__(self, pool: WorkerPool, store: Any, engine_ctl: Any, settings_fn: Callable[[], Any],
                 documents: Callable[[], Any] | None = None, tools: Any = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pool, self.store, self.engine_ctl = pool, store, engine_ctl
        self.settings_fn, self.documents, self.tools = settings_fn, documents, tools
        self._worker: GeneratorWorker | None = None
        self._assistant: Assistant | None = None
        self.samples = 1  # self-consistency answers per turn (the window's "Answers" picker)

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
        decoding, system_prompt = chat_setup(self.store, conversation_id, user)
        docs = self.documents() if self.documents is not None else None
        box = self.tools.toolbox() if self.tools is not None else None
        self._assistant = Assistant(engine, self.store, decoding=decoding, system_prompt=system_prompt,
                                    documents=docs, caller=Caller.WINDOW, tools=box,
                                    reasoning_default=model_reasoning_default(user, model_id(engine.model_path)),
                                    samples=self.samples)
        worker = GeneratorWorker(run_turn, self._assistant, conversation_id, text, **kw)
        self._worker = worker
        self.busy_changed.emit(True)
        self.pool.start(worker, on_yield=self._item, on_return=self._returned, on_error=self.failed.emit,
                        on_finish=self._done)
        return True

    def _item(self, item: tuple) -> None:
        kind, payload = item
        {"delta": self.delta, "reasoning": self.reasoning, "evidence": self.evidence, "tool_call": self.tool_call,
         "tool_result": self.tool_result, "tool_notice": self.tool_notice}[kind].emit(payload)

    def answer(self, call_id: str, permission: Permission) -> None:
        """The person's answer to a call the running turn asks about."""
        if self.tools is not None:
            self.tools.answer(call_id, permission)

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

    def stop_thinking(self) -> bool:
        """End the running answer's thinking now; the answer follows. True when the engine will."""
        return self._assistant is not None and self._assistant.stop_thinking()

    def stop(self) -> None:
        """Stop the answer being written (within one token or one prefill chunk)."""
        if self._assistant is not None:
            self._assistant.cancel()
        if self.tools is not None:
            self.tools.release_all()
        if self._worker is not None:
            self._worker.quit()
