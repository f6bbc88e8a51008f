"""One chat turn end to end, with the engine injected: store the user message, assemble the context
(summarizing older turns when the verbatim history no longer fits), stream the answer into the store as
``incomplete`` and finish it as ``complete`` (or ``error``), and report metrics and the context breakdown.

The engine is two callables, so this module never imports it and is tested with fakes:

The reasoning: docs/memory.md, 'app/assistant/session.py'.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from app.assistant.evidence import given
from app.engine.chat.tool_stream import ToolsDone
from app.errors import HearthError
from app.memory.context import ContextBuilder, ContextPlan, EvidenceInput, Grounder, Summarizer, SummaryRequest
from app.memory.records import Citation, reasoning_info_from
from app.memory.store import Store
from app.protocol.tools import ToolCall
from app.protocol.types import ChatMessage, Delta, Done

log = logging.getLogger(__name__)


GenerateFn = Callable[..., Iterator[Any]]


@dataclass
class TurnResult:
    """The outcome of one turn. ``metrics``: the engine's metrics dict; ``context``: the token breakdown of
    the prompt (``ContextPlan.breakdown``); ``summaries_added``: ids of summaries written for this turn;
    ``dropped_ids``: older messages left out because they could not be summarized (normally empty);
    ``tool_calls``: the calls the answer made (its turn goes on once their results are stored);
    ``tool_errors``: why calls the model wrote were not valid (they were stored as text), or None;
    ``reasoning``: the answer's thinking, stored apart from ``text`` ("" when the model did not think)."""

    conversation_id: str
    user_message_id: str
    message_id: str
    text: str
    finish_reason: str
    metrics: dict
    context: dict
    summaries_added: list[str] = field(default_factory=list)
    dropped_ids: list[str] = field(default_factory=list)
    tool_calls: tuple[ToolCall, ...] = ()
    tool_errors: str | None = None
    reasoning: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _metrics_dict(metrics: Any) -> dict:
    if metrics is None:
        return {}
    if hasattr(metrics, "to_dict"):
        return dict(metrics.to_dict())
    return dict(metrics) if isinstance(metrics, dict) else {}


def _close(events: Iterator[Any]) -> None:
    close = getattr(events, "close", None)
    if close is not None:
        close()


def _title_from(text: str, limit: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


class ChatSession:
    """Runs turns of stored conversations against one loaded model.

    ``count_tokens``: the model's tokenizer count (tokens). ``n_ctx``: its context window (tokens);
    ``max_tokens``: tokens reserved for each answer. ``model`` / ``settings`` are recorded with conversations,
    answers and summaries. ``update_interval_s``: how often (seconds) streamed text is committed; a killed
    process loses at most that much of the answer. Further keyword arguments go to ``ContextBuilder``.
    """

    def __init__(self, store: Store, generate_fn: GenerateFn, count_tokens: Callable[[str], int], *,
                 n_ctx: int, max_tokens: int = 256, system_prompt: str = "", summarizer: Summarizer | None = None,
                 model: str = "", settings: dict | None = None, generate_options: dict | None = None,
                 summary_options: dict | None = None, update_interval_s: float = 0.25,
                 clock: Callable[[], float] = time.monotonic, **builder_options: Any) -> None:
        self.store, self.generate_fn = store, generate_fn
        self.builder = ContextBuilder(count_tokens, n_ctx, max_tokens, system_prompt, **builder_options)
        self.summarizer: Summarizer = summarizer or self._summarize_with_generate
        self.model, self.settings = model, dict(settings or {})
        self.generate_options = dict(generate_options or {})
        self.summary_options = dict(summary_options or {})
        self.update_interval_s, self.clock = update_interval_s, clock

    def new_conversation(self, title: str = "") -> str:
        return self.store.create_conversation(title, self.model, self.settings)

    # ---- public turns -----------------------------------------------------------------------------------------

    def send(self, conversation_id: str, text: str, *, on_delta: Callable[[str], None] | None = None,
             **kw: Any) -> TurnResult:
        """Run one turn and return its result (``stream`` without the events; ``on_delta`` sees each piece)."""
        result = None
        for item in self.stream(conversation_id, text, **kw):
            if isinstance(item, TurnResult):
                result = item
            elif on_delta is not None and isinstance(item, Delta):
                on_delta(item.text)
        assert result is not None
        return result

    def stream(self, conversation_id: str, text: str, *, parent_id: str | None = None,
               evidence: EvidenceInput = None, citations: Sequence[Citation | dict] = (),
               ground: Grounder | None = None, **options: Any) -> Iterator[Any]:
        """Store ``text`` as a user message under ``parent_id`` (default: the conversation's tip; give the
        edited message's parent to edit), then answer it. Yields the ``ContextPlan``, the engine's events, then a
        ``TurnResult``. ``evidence``: retrieved passages for this turn (``EvidenceText``, trimmed passage by
        passage to fit, in the message); ``ground``: a ``Grounder`` instead, which puts each question's
        evidence in its own user message (``ContextBuilder.build``); ``citations``: stored with the answer."""
        conv = self.store.get_conversation(conversation_id)
        parent = parent_id if parent_id is not None else conv.current_message_id
        user_id = self.store.append_message(conversation_id, "user", text, parent,
                                            token_count=self.builder.count(text))
        if not conv.title:
            self.store.rename(conversation_id, _title_from(text))
        yield from self._answer(conversation_id, user_id, evidence, citations, options, ground)

    def regenerate(self, conversation_id: str, user_message_id: str, *,
                   evidence: EvidenceInput = None, citations: Sequence[Citation | dict] = (),
                   ground: Grounder | None = None, **options: Any) -> Iterator[Any]:
        """A new answer to an existing user message: a sibling branch of the earlier answers."""
        yield from self._answer(conversation_id, user_message_id, evidence, citations, options, ground)

    def continue_after(self, conversation_id: str, message_id: str, *, evidence: EvidenceInput = None,
                       citations: Sequence[Citation | dict] = (), ground: Grounder | None = None,
                       **options: Any) -> Iterator[Any]:
        """The next step of a turn with tools: an answer under ``message_id`` (the turn's last tool result),
        given the turn's message and its calls and results so far. Yields as ``stream`` does."""
        yield from self._answer(conversation_id, message_id, evidence, citations, options, ground)

    def add_tool_result(self, conversation_id: str, parent_id: str, call: ToolCall, text: str, *,
                        meta: dict | None = None) -> str:
        """Store the result of ``call`` (made by the assistant message ``parent_id``, or answered after an
        earlier result of the same step) as a ``tool`` message holding all of ``text``; returns its id."""
        return self.store.append_message(conversation_id, "tool", text, parent_id, tool_call_id=call.id,
                                         name=call.name, meta=meta)

    # ---- the turn ---------------------------------------------------------------------------------------------

    def _parts(self, message_id: str) -> tuple[list, Any, list]:
        """(history before the turn, the turn's user message, what the turn holds after it) for the branch
        ending at ``message_id``."""
        path = self.store.path_to(message_id)
        u = max((i for i, m in enumerate(path) if m.role == "user"), default=len(path) - 1)
        return path[:u], path[u], path[u + 1:]

    def plan(self, conversation_id: str, user_message_id: str, evidence: EvidenceInput = None,
             ground: Grounder | None = None) -> tuple[ContextPlan, list[str]]:
        """The context for answering ``user_message_id`` (or for the next step after a tool result: the turn's
        message and its calls and results so far), summarizing first while the history does not fit.
        Returns the plan and the ids of summaries added."""
        history, user, tail = self._parts(user_message_id)
        added: list[str] = []
        seen: set[tuple[str, str]] = set()
        for _ in range(16):
            plan = self.builder.build(history, user.content, summaries=self.store.summaries_for(conversation_id),
                                      evidence=evidence, tail=tail, ground=ground)
            req = plan.summary_request
            if req is None or plan.needs_summary in seen:
                return plan, added
            seen.add(plan.needs_summary)  # type: ignore[arg-type]
            sid = self._summarize(conversation_id, req)
            if sid is None:
                return plan, added
            added.append(sid)
        return plan, added

    def _summarize(self, conversation_id: str, req: SummaryRequest) -> str | None:
        try:
            text = (self.summarizer(req.prompt, req.max_tokens) or "").strip()
        except HearthError as exc:
            log.warning("summarizing messages %s..%s failed: %s; older turns are left out of this prompt",
                        req.first_message_id[:12], req.last_message_id[:12], exc)
            return None
        if not text:
            log.warning("the summary of %s..%s came back empty; older turns are left out of this prompt",
                        req.first_message_id[:12], req.last_message_id[:12])
            return None
        text = self._clip(text, req.max_tokens)
        settings = {**self.settings, "max_tokens": req.max_tokens, "rollup_of": list(req.previous),
                    "messages": len(req.message_ids)}
        return self.store.add_summary(conversation_id, text, req.first_message_id, req.last_message_id,
                                      self.model, settings)

    def _clip(self, text: str, max_tokens: int) -> str:
        while self.builder.count(text) > max_tokens and len(text) > 1:
            text = text[: int(len(text) * 0.9)].rstrip()
        return text

    def _summarize_with_generate(self, prompt: str, max_tokens: int) -> str:
        parts = []
        opts = {**self.summary_options, "max_tokens": max_tokens}
        events = iter(self.generate_fn([ChatMessage("user", prompt)], **opts))
        try:
            for ev in events:
                if isinstance(ev, Done):
                    break
                if isinstance(ev, Delta):
                    parts.append(ev.text)
        finally:
            _close(events)
        return "".join(parts)

    def _answer(self, conversation_id: str, after_id: str, evidence: Any, citations: Sequence[Any],
                options: dict, ground: Grounder | None = None) -> Iterator[Any]:
        plan, added = self.plan(conversation_id, after_id, evidence, ground)
        yield plan
        meta = {"model": self.model, "context": plan.breakdown, "summary_ids": plan.summary_ids}
        aid = self.store.begin_streaming_message(conversation_id, after_id, meta=meta)
        opts = {**self.generate_options, "max_tokens": self.builder.max_tokens, **options}
        effort = getattr(getattr(opts.get("reasoning"), "budget", None), "effort", None)
        text: list[str] = []
        thought: list[str] = []
        done = None
        last = self.clock()
        events = iter(self.generate_fn(plan.messages, **opts))
        try:
            for ev in events:
                if isinstance(ev, (Done, ToolsDone)):
                    done = ev
                elif isinstance(ev, Delta):
                    text.append(ev.text)
                    if ev.reasoning:
                        thought.append(ev.reasoning)
                    if self.clock() - last >= self.update_interval_s:
                        self.store.update_streaming_message(aid, "".join(text),
                                                            "".join(thought) if thought else None)
                        last = self.clock()
                yield ev
                if done is not None:
                    break
        except BaseException as exc:  # cancelled, engine crashed, consumer went away: keep what was said
            self.store.finish_message(aid, "error", content="".join(text),
                                      meta={"error": type(exc).__name__, "message": str(exc)},
                                      reasoning="".join(thought) if thought else None,
                                      reasoning_info={"effort": effort} if thought and effort else None)
            raise
        finally:
            _close(events)  # release the engine (a Generation stops and frees its slot)
        user_id = self._parts(after_id)[1].id
        yield self._finish(conversation_id, user_id, aid, plan, added, "".join(text), done, citations,
                           "".join(thought), effort)

    def _finish(self, conversation_id: str, user_id: str, aid: str, plan: ContextPlan, added: list[str],
                text: str, done: Done | ToolsDone | None, citations: Sequence[Any], thought: str = "",
                effort: str | None = None) -> TurnResult:
        outcome = done.outcome if isinstance(done, ToolsDone) else None
        if isinstance(done, ToolsDone):
            done = done.done
        metrics = _metrics_dict(done.metrics if done is not None else None)
        finish_reason = (outcome.finish_reason if outcome else done.finish_reason if done else None) or "unknown"
        calls = outcome.calls if outcome else ()
        errors = outcome.error_message if outcome else None
        text = outcome.text if outcome else text
        tokens = metrics.get("completion_tokens") or self.builder.count(text)
        thought = (done.reasoning if done is not None and done.reasoning else thought) or ""
        voted = (done.info or {}).get("self_consistency") if done is not None else None
        thinking = bool(thought or metrics.get("reasoning_tokens"))
        _tool_definitions(plan.breakdown, (done.info or {}) if done is not None else {})
        passages = plan.grounding.evidence if plan.grounding is not None else ()
        final = self.store.finish_message(aid, "complete", content=text, token_count=tokens, tool_calls=calls,
                                          meta={"finish_reason": finish_reason, "metrics": metrics,
                                                "context": plan.breakdown,
                                                **({"evidence": given(passages)} if passages else {}),
                                                **({"tool_errors": errors} if errors else {}),
                                                **({"self_consistency": voted} if voted else {})},
                                          reasoning=thought if thinking else None,
                                          reasoning_info=reasoning_info_from(metrics, effort) if thinking else None)
        if citations:
            self.store.add_citations(final, citations)
        return TurnResult(conversation_id, user_id, final, text, finish_reason, metrics, plan.breakdown,
                          added, plan.dropped_ids, calls, errors, thought)


def _tool_definitions(breakdown: dict[str, int], info: dict[str, Any]) -> None:
    """Move the tokens the tool definitions took (the engine's ``info["tools_tokens"]``) out of the exact
    breakdown's ``template`` part (the prompt count includes them, the parts do not) into
    ``tool_definitions``. Nothing when no tools were offered or the breakdown is an estimate."""
    defs = info.get("tools_tokens")
    if isinstance(defs, int) and defs > 0 and "template" in breakdown:
        moved = min(defs, breakdown["template"])
        breakdown["template"] -= moved
        breakdown["tool_definitions"] = moved
