"""``Assistant``: one chat turn of a stored conversation, for every adapter (CLI, desktop, HTTP).

The reasoning: docs/memory.md, 'app/assistant/turn.py'.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any, Union

from app.assistant import evidence as ev
from app.assistant.budget import DEFAULT_MAX_TOKENS, prompt_tokens
from app.assistant.session import ChatSession, TurnResult
from app.assistant.tool_loop import ToolBox, ToolCallRequested, ToolNotice, ToolResultShown
from app.catalog.registry import model_id
from app.engine.chat.tool_parser import TextPiece
from app.engine.chat.tool_stream import ToolsDone, ToolStream
from app.engine.policies.consistency import parse_self_consistency
from app.engine.policies.self_consistency import SelfConsistencyRun
from app.memory.context import ContextPlan, Grounder
from app.protocol.backend import Backend
from app.protocol.reasoning import Layer, ReasoningSettings, resolve_budget
from app.protocol.tools import ToolChoice, ToolSpec
from app.protocol.types import ChatMessage, DecodingParams, Delta, Done, GenerateRequest, ReasoningRequest
from app.retrieval.types import Evidence

log = logging.getLogger(__name__)
DEFAULT_K = 4  # passages per turn
SUMMARY_OPTIONS = {"temperature": 0.0}  # summaries are greedy: the same history gives the same summary


class Caller(str, enum.Enum):
    """Who a generation is for; ``priority`` is its ``GenerateRequest.priority`` (the engine's scheduler admits
    higher first, equal priorities in arrival order)."""

    WINDOW = "window"  # the desktop window: a person is watching the answer appear
    PORT = "port"  # the HTTP port (API clients, also when the desktop app hosts it)
    CLI = "cli"  # `hearth chat` in a terminal (its own engine)

    @property
    def priority(self) -> int:
        """1 for the window, 0 for everyone else."""
        return 1 if self is Caller.WINDOW else 0

    def stamp(self, request: GenerateRequest) -> GenerateRequest:
        """``request`` with this caller's priority."""
        return replace(request, priority=self.priority)


@dataclass(frozen=True)
class EvidenceFound:
    """The passages given to the model for this turn (best first, after trimming to the context), and
    ``notice`` when search was degraded."""

    evidence: tuple[Evidence, ...]
    notice: str | None = None


@dataclass(frozen=True)
class TextDelta:
    """A piece of the answer, as the engine streamed it."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """A piece of the model's thinking, as the engine streamed it (never part of the answer's text)."""

    text: str


@dataclass(frozen=True)
class TurnDone:
    """The end of a turn. ``result``: the stored answer (``TurnResult``: ids, text, finish_reason, metrics,
    context breakdown); ``citations``: what the answer cites, each with the citation check
    (``evidence.checked_citations``: ``supported``, ``sentence_start`` / ``sentence_end``, ``support``; stored
    with it); ``evidence``: what the model was given (``evidence.given`` dicts); ``notice``: the search notice,
    if any; ``attributions``: each claim sentence attributed to a passage given (or none) with its facts
    checked, cited or not (``evidence.attributions``; stored with it)."""

    result: TurnResult
    citations: list[dict]
    evidence: list[dict]
    notice: str | None = None
    attributions: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of ``hearth chat --message --json``."""
        r = self.result
        return {"conversation_id": r.conversation_id, "message_id": r.message_id, "text": r.text,
                "reasoning": r.reasoning, "finish_reason": r.finish_reason, "metrics": r.metrics,
                "context": r.context, "summaries_added": r.summaries_added, "dropped_ids": r.dropped_ids,
                "citations": self.citations, "attributions": self.attributions, "evidence": self.evidence,
                "search_notice": self.notice}


TurnEvent = Union[EvidenceFound, ReasoningDelta, TextDelta, ToolCallRequested, ToolResultShown, ToolNotice,
                  TurnDone]


class EngineCalls:
    """``generate_fn`` for ``ChatSession`` over ``Engine.generate``: per-call options override ``base``
    decoding fields; every request carries ``caller``'s priority (summaries too: the same person waits for
    them) and the turn's ``reasoning`` (summaries none); the running ``Generation`` is remembered so that
    ``cancel()`` and ``stop_thinking()`` reach it from any thread."""

    def __init__(self, engine: Backend, base: DecodingParams, caller: Caller = Caller.CLI) -> None:
        self.engine, self.base, self.caller = engine, base, caller
        self._known = {f.name for f in fields(DecodingParams)}
        self._lock = threading.Lock()
        self._current: Any = None
        self.cancelled = False
        self.tools: tuple[ToolSpec, ...] = ()  # the turn's tools: counted with every prompt (their definitions)

    def generate(self, messages: list[ChatMessage], max_tokens: int | None = None, *,
                 tools: tuple[ToolSpec, ...] = (), tool_choice: ToolChoice | None = None,
                 parallel_tool_calls: bool = True, reasoning: ReasoningRequest | None = None,
                 samples: int = 1, **opts: Any) -> Iterator[Any]:
        """The engine's events for ``messages``; with ``tools``, the answer read by ``ToolStream``: ``Delta``
        for the text outside calls (and the thinking, as ``Delta.reasoning``), then ``ToolsDone`` (the calls)
        instead of ``Done``. ``samples`` > 1 (a turn's answer without tools): self-consistency, ``_vote``."""
        dec = self.base.updated(**{k: v for k, v in opts.items() if k in self._known}, max_tokens=max_tokens)
        req = self.caller.stamp(GenerateRequest(messages=tuple(messages), decoding=dec, tools=tuple(tools),
                                                tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                                                reasoning=reasoning))
        if samples > 1 and not tools:
            yield from self._vote(req, samples)
            return
        gen = self.engine.generate(req)
        with self._lock:
            self._current = gen
            if self.cancelled:
                gen.cancel()
        try:
            if tools:
                yield from _read_tools(gen, ToolStream.for_request(req, self.engine.tool_format()))
            else:
                yield from gen
        finally:
            gen.close()
            with self._lock:
                self._current = None

    def _vote(self, req: GenerateRequest, samples: int) -> Iterator[Any]:
        """``samples`` answers of ``req``, voted: the chosen one's text and thinking as one ``Delta``, then its
        ``Done`` with the vote in ``info["self_consistency"]``."""
        run = SelfConsistencyRun(self.engine, req, parse_self_consistency({"n": samples}))
        with self._lock:
            self._current = run
            if self.cancelled:
                run.cancel()
        try:
            result = run.run()
        finally:
            with self._lock:
                self._current = None
        chosen = result.chosen
        yield Delta(chosen.text, reasoning=chosen.reasoning)
        yield replace(chosen, info={**chosen.info, "self_consistency": result.to_api()})

    def reset(self) -> None:
        """A new turn: forget a cancel of the previous one."""
        with self._lock:
            self.cancelled = False

    def cancel(self) -> None:
        """Stop the running generation (and any later one of this turn)."""
        with self._lock:
            self.cancelled = True
            if self._current is not None:
                self._current.cancel()

    def stop_thinking(self) -> bool:
        """Ask the running generation to end its thinking and answer now; True when it will (False: nothing
        is running, or its thinking already ended)."""
        with self._lock:
            gen = self._current
        return bool(gen is not None and not isinstance(gen, SelfConsistencyRun) and gen.stop_thinking())

    def count_messages(self, messages: list[ChatMessage]) -> int:
        return prompt_tokens(self.engine, messages, self.tools)


def _read_tools(events: Iterator[Any], reader: ToolStream) -> Iterator[Any]:
    """An engine stream read for tool calls (``ToolStream`` reads the answer text only): the thinking passes
    through at once as ``Delta("", reasoning=...)``, the text outside calls as ``Delta``, then ``ToolsDone``.
    (``tool_stream.stream_tools`` drops ``Delta.reasoning``; the thinking must stream while the answer, which
    the reader may hold back, has not begun.)"""
    for event in events:
        if isinstance(event, Done):
            pieces, outcome = reader.finish(event.finish_reason)
            yield from (Delta(p.text) for p in pieces if isinstance(p, TextPiece))
            yield ToolsDone(event, outcome)
            return
        if event.reasoning:
            yield Delta("", reasoning=event.reasoning)
        yield from (Delta(p.text) for p in reader.feed(event.text) if isinstance(p, TextPiece))


class Assistant:
    """Turns of stored conversations on one loaded ``engine``, stored in ``store`` (``app.memory.Store``).

    ``decoding``: sampling defaults (the person's saved settings with any per-command overrides);
    ``system_prompt``: text of the system message; ``documents``: a ``DocumentSource`` to ground turns in, or
    None; ``k``: passages per turn (1 to ``evidence.MAX_K``, else ``InvalidRequest``); ``caller``: who asks
    (``Caller``: the desktop window passes ``Caller.WINDOW`` so its turns go before waiting API requests);
    ``tools``: a ``ToolBox`` whose tools the model may call (None: no tools); ``reasoning_default``: the
    model's default reasoning layer (``ReasoningSettings`` or a mapping with ``reasoning_effort`` /
    ``reasoning_budget`` / ``reasoning_deadline_s``; validated here, ``InvalidRequest`` names a bad field);
    ``answer_now``: a line inserted after a forced end of thinking (None: nothing); ``samples``:
    self-consistency answers per generation (1: off; see the module docstring). One turn runs at a time per
    assistant."""

    def __init__(self, engine: Backend, store: Any, *, decoding: DecodingParams | None = None,
                 system_prompt: str = "", documents: ev.DocumentSource | None = None, k: int = DEFAULT_K,
                 caller: Caller = Caller.CLI, tools: ToolBox | None = None, reasoning_default: Layer = None,
                 answer_now: str | None = None, samples: int = 1) -> None:
        self.engine, self.store, self.documents, self.k = engine, store, documents, ev.check_k(k)
        self.tools = tools
        self.reasoning_default = _model_layer(reasoning_default)
        self.answer_now = answer_now
        self.decoding = decoding or DecodingParams()
        self.calls = EngineCalls(engine, self.decoding, Caller(caller))
        parse_self_consistency({"n": samples})  # InvalidRequest naming hearth.self_consistency.n
        self.samples = samples
        self.session = _open_session(engine, store, self.calls, self.decoding, system_prompt)

    @property
    def model(self) -> str:
        """The model id recorded with conversations and answers."""
        return self.session.model

    def new_conversation(self, title: str = "") -> str:
        return self.session.new_conversation(title)

    def cancel(self) -> None:
        """Stop the answer being written, or the tool call being run (any thread)."""
        self.calls.cancel()
        if self.tools is not None:
            self.tools.cancel()

    def stop_thinking(self) -> bool:
        """End the running generation's thinking now; it then answers (any thread). True when it will."""
        return self.calls.stop_thinking()

    def reasoning_for(self, conversation_id: str,
                      request: ReasoningSettings | None = None) -> ReasoningRequest | None:
        """The ``ReasoningRequest`` a turn of ``conversation_id`` runs with: ``request`` (this turn's layer) >
        the conversation's setting > ``reasoning_default`` (None when no layer sets anything)."""
        budget = resolve_budget(*(_fields(request)), per_conversation=self.store.reasoning_settings(conversation_id),
                                per_model_default=self.reasoning_default)
        return ReasoningRequest(budget, self.answer_now) if budget.asked else None

    def send(self, conversation_id: str, text: str | None, **kw: Any) -> TurnDone:
        """``turn`` run to its end; ``on_delta(text)`` (optional) sees each piece of the answer,
        ``on_reasoning(text)`` (optional) each piece of the thinking."""
        on_delta = kw.pop("on_delta", None)
        on_reasoning = kw.pop("on_reasoning", None)
        done = None
        for item in self.turn(conversation_id, text, **kw):
            if isinstance(item, ReasoningDelta) and on_reasoning is not None:
                on_reasoning(item.text)
            elif isinstance(item, TextDelta) and on_delta is not None:
                on_delta(item.text)
            elif isinstance(item, TurnDone):
                done = item
        assert done is not None
        return done

    def turn(self, conversation_id: str, text: str | None, *, parent_id: str | None = None, edit: bool = False,
             regenerate_of: str | None = None, reasoning: ReasoningSettings | None = None) -> Iterator[TurnEvent]:
        """Answer ``text`` in ``conversation_id`` (see the module docstring). ``parent_id``: answer under this
        message instead of the tip (with ``edit``: ``text`` replaces the message after it; None with ``edit``
        means a new first message); ``regenerate_of``: a new answer to this stored user message (``text``
        unused); ``reasoning``: this turn's reasoning layer (over the conversation's and the model's). Errors:
        ``StoreError`` for an unknown conversation, ``ContextLengthExceeded``, ``Cancelled``,
        ``EngineCrashed`` (the partial answer is kept), ``InvalidRequest`` for a bad reasoning value."""
        self.calls.reset()
        if self.tools is not None:
            self.tools.reset()
        thinking = {"reasoning": self.reasoning_for(conversation_id, reasoning), "samples": self.samples}
        query = text if regenerate_of is None else self.store.get_message(regenerate_of).content
        grounder = self._grounder(conversation_id, query or "")
        specs = self.calls.tools = self.tools.specs() if self.tools is not None else ()
        opts = {**(self.tools.options(specs, 1) if self.tools is not None else {}), **thinking}
        stream = self._stream(conversation_id, text, parent_id, edit, regenerate_of, grounder, opts)
        seen = _Seen()
        for step in range(1, (self.tools.max_steps if self.tools is not None else 1) + 1):
            result = yield from self._relay(stream, seen)
            if result.tool_errors:
                yield ToolNotice(f"The model wrote a tool call that was not valid ({result.tool_errors}); "
                                 "it is kept as text.")
            if not result.tool_calls or self.tools is None or step >= self.tools.max_steps:
                break
            tip = yield from self.tools.run_calls(self.session, conversation_id, result.tool_calls,
                                                  result.message_id, step)
            stream = self.session.continue_after(conversation_id, tip, ground=grounder,
                                                 **self.tools.options(specs, step + 1), **thinking)
        yield self._done(result, seen.given, seen.notice)

    def _relay(self, stream: Iterator[Any], seen: "_Seen") -> Iterator[TurnEvent]:
        """One generation's events as the turn's (evidence on the first plan only); returns its
        ``TurnResult``."""
        for item in stream:
            if isinstance(item, ContextPlan):
                grounding = item.grounding
                seen.given = grounding.evidence if grounding is not None else ()
                if not seen.shown:
                    seen.shown = True
                    seen.notice = grounding.notice if grounding is not None else None
                    if seen.given:
                        yield EvidenceFound(seen.given, seen.notice)
            elif isinstance(item, Delta):
                if item.reasoning:
                    yield ReasoningDelta(item.reasoning)
                if item.text:
                    yield TextDelta(item.text)
            elif isinstance(item, TurnResult):
                return item
        raise AssertionError("the session's stream ended without a TurnResult")

    def _grounder(self, conversation_id: str, query: str) -> Grounder | None:
        """What grounds this turn's prompt (``ContextBuilder.build(ground=...)``): ``grounding.ground`` over the
        conversation's chosen documents (its ``documents`` setting; absent: all), so that each user message of
        the prompt carries its own question's evidence, the same text on every later turn (docs/retrieval.md,
        "Evidence placement"). None without documents or without a question."""
        if self.documents is None or not query.strip():
            return None
        from app.assistant.grounding import ground

        paths = self.store.get_conversation(conversation_id).settings.get("documents")
        if paths is not None and not paths:
            return None  # no documents attached to this chat
        source = _ChosenDocuments(self.documents, None if paths is None else list(paths))
        reserve = self.session.builder.max_tokens
        return lambda messages: ground(self.engine, source, messages, k=self.k, max_tokens=reserve)

    def _stream(self, conversation_id: str, text: str | None, parent_id: str | None, edit: bool,
                regenerate_of: str | None, grounder: Grounder | None, opts: dict) -> Iterator[Any]:
        if regenerate_of is not None:
            return self.session.regenerate(conversation_id, regenerate_of, ground=grounder, **opts)
        if edit and parent_id is None:
            self.store.set_current(conversation_id, None)  # editing the first message: a new first message
        return self.session.stream(conversation_id, text or "", parent_id=parent_id, ground=grounder, **opts)

    def _done(self, result: TurnResult, given: tuple[Evidence, ...], notice: str | None) -> TurnDone:
        """The turn's end: the answer's citations checked (``evidence.checked_citations`` with the source's
        checker) and its sentences attributed (``evidence.attributions``, cited or not), both stored with it,
        so a reopened conversation shows the same marks."""
        checker = self.documents.checker() if given and self.documents is not None else None
        cites = ev.checked_citations(result.text, given, checker)
        if cites:
            self.store.add_citations(result.message_id, cites)
        attrs = ev.attributions(result.text, given, checker)
        if attrs:
            self.store.add_attributions(result.message_id, attrs)
        return TurnDone(result, cites, ev.given(given), notice, attrs)


@dataclass
class _Seen:
    """What a turn has shown so far: the passages in the latest plan's prompt (all its turns', prompt order),
    the notice, and whether ``EvidenceFound`` went out."""

    given: tuple[Evidence, ...] = ()
    notice: str | None = None
    shown: bool = False


class _ChosenDocuments:
    """``documents`` searched among ``paths`` only (None: all), as ``grounding.ground`` searches a source. A
    broken index does not stop the chat: that question is answered without evidence, and the notice says why."""

    def __init__(self, documents: ev.DocumentSource, paths: list[str] | None) -> None:
        self.documents, self.paths = documents, paths

    def search(self, query: str, k: int) -> ev.Found:
        try:
            return self.documents.search(query, k, self.paths)
        except Exception as exc:  # noqa: BLE001 - logged with its traceback; the answer goes on without documents
            log.exception("document search failed; answering without documents")
            return ev.Found((), f"document search failed ({type(exc).__name__}: {exc}); answered without documents")

    def checker(self) -> Any:
        return self.documents.checker()


def _model_layer(value: Layer) -> ReasoningSettings:
    """The model's default reasoning layer, validated (``InvalidRequest`` naming the field)."""
    if value is None:
        return ReasoningSettings()
    if isinstance(value, ReasoningSettings):
        return value.validate("model")
    return ReasoningSettings.from_mapping(value, "model")


def _fields(s: ReasoningSettings | None) -> tuple[Any, Any, Any]:
    return (None, None, None) if s is None else (s.effort, s.budget_tokens, s.deadline_s)


def _open_session(engine: Backend, store: Any, calls: EngineCalls, decoding: DecodingParams,
                  system_prompt: str) -> ChatSession:
    """The ``ChatSession`` every adapter uses (docs/memory.md, 'app/assistant/turn.py' for what it fixes)."""
    n_ctx = engine.settings.n_ctx
    kept = {k: v for k, v in engine.settings.to_dict().items() if k in ("n_ctx", "type_k", "type_v", "flash_attn")}
    overhead = 5 if engine.info.get("template") in ("gemma", "transcript") else 6
    return ChatSession(store, calls.generate, engine.count_tokens, n_ctx=n_ctx,
                       max_tokens=decoding.max_tokens or DEFAULT_MAX_TOKENS, system_prompt=system_prompt,
                       model=model_id(engine.model_path), settings=kept, summary_options=dict(SUMMARY_OPTIONS),
                       message_overhead=overhead, count_messages=calls.count_messages)
