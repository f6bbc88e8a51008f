"""Thinking budgets: how much a request may think, how thinking is turned off, and budget forcing.

``resolve_budget`` takes the budget from three layers (request, conversation, model: the first that sets one
wins), ``ReasoningBudget.fit`` leaves the answer room, ``render_kwargs`` / ``plan_prompt`` turn thinking off at
budget 0, and ``BudgetForcer`` is the pure state machine of budget forcing (s1).

The reasoning: docs/reasoning.md, 'Budgets', 'Budget 0: no thinking where the template allows' and
'Budget forcing'.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

from app.engine.chat.thinking import AnswerPiece, Piece, ReasoningSplitter, ThinkingMarkers
from app.errors import InvalidRequest
from app.protocol.reasoning import ReasoningBudget, ReasoningSettings


# -- the prompt ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PromptPlan:
    """How a rendered prompt is finished for thinking. ``suffix``: text to append to the prompt (tokenize with
    special=True); ``started_inside``: generation begins inside thinking (give it to ``ReasoningSplitter`` /
    ``BudgetForcer``); ``thinking``: the model is expected to think (False: no thinking)."""

    suffix: str
    started_inside: bool
    thinking: bool


def render_kwargs(markers: ThinkingMarkers, budget: ReasoningBudget) -> dict[str, Any]:
    """Extra variables for the model's own (GGUF) template: the switch off for budget 0 (Qwen3:
    ``{"enable_thinking": False}``), and GPT-OSS's ``reasoning_effort`` from the effort (low for budget 0:
    harmony always has an analysis channel, which ``plan_prompt`` then leaves empty)."""
    kw: dict[str, Any] = {}
    if markers.switch and budget.off:
        kw[markers.switch] = False
    if markers.effort_var:
        if budget.off:
            kw[markers.effort_var] = "low"
        elif budget.effort in ("low", "medium", "high"):
            kw[markers.effort_var] = budget.effort
    return kw


def plan_prompt(markers: ThinkingMarkers, prompt: str, budget: ReasoningBudget) -> PromptPlan:
    """What to append to ``prompt`` (the text rendered with ``render_kwargs``) and where generation starts.

    Budget 0: a prompt that ends inside thinking is closed (``close``); a template with a switch already
    rendered thinking off; a prefill-only model is not prefilled; any other model gets an empty thinking
    block. Otherwise: inside stays inside; a prefill-only model is prefilled with its start marker when a
    budget was asked for (``ReasoningBudget.asked``), else it does not think; a native thinker opens thinking
    by itself."""
    inside = markers.inside_after(prompt)
    if budget.off:
        if inside:
            return PromptPlan(markers.close, False, False)
        if markers.switch or markers.prefill_start:
            return PromptPlan("", False, False)
        return PromptPlan(markers.empty_thinking, False, False)
    if inside:
        return PromptPlan("", True, True)
    if markers.prefill_start:
        return PromptPlan(markers.start + "\n", True, True) if budget.asked else PromptPlan("", False, False)
    return PromptPlan("", False, True)


# -- forcing ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReasoningMetrics:
    """Thinking's cost in one answer.

    ``reasoning_tokens``: sampled tokens on the thinking side (a token that opens or closes thinking
    included; ``usage.completion_tokens_details.reasoning_tokens``); ``answer_tokens``: the other sampled
    tokens (inserted text is in neither). ``ttfat_s``: seconds from the request's start (``t0``) to the first
    sampled token that gave answer text (None: no answer text). ``thinking_s``: seconds from the first
    thinking token to the end of thinking (its closing token, the forcing, or the last token when it never
    closed; the prefill before the first token is not in it). ``forced``: Hearth ended thinking;
    ``stopped_by``: why ("budget", "deadline", "user"; None when the model ended it or never thought);
    ``unclosed``: the output ended with thinking still open."""

    reasoning_tokens: int = 0
    answer_tokens: int = 0
    ttfat_s: float | None = None
    thinking_s: float = 0.0
    forced: bool = False
    stopped_by: str | None = None
    unclosed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ForceStep:
    """What one sampled token did. ``pieces``: reasoning / answer text completed (the inserted text's own
    pieces included); ``insert``: text to append after this token before sampling the next ("" for none;
    tokenize with special=True, decode it into the sequence, and do not feed its tokens to ``step``);
    ``reason``: why it was inserted ("budget", "deadline", "user")."""

    pieces: tuple[Piece, ...]
    insert: str = ""
    reason: str | None = None


class BudgetForcer:
    """Budget forcing for one request, as a pure state machine (s1: Muennighoff et al. 2025).

    ``markers``: the model's ``ThinkingMarkers``; ``budget_tokens``: thinking tokens allowed (None: no
    limit; 0: end thinking as soon as it opens); ``deadline_s``: seconds from ``t0`` after which thinking is
    ended (None: none); ``answer_now``: a line inserted after the end of thinking (e.g. "Final answer:";
    None: nothing); ``started_inside`` (keyword): the prompt ends inside thinking (``PromptPlan``); ``t0``
    (keyword): the request's start, on the clock later given to ``step`` (``time.perf_counter`` seconds).

    ``step(text, now)`` once per sampled token, in order (``text``: its decoded text, "" while a UTF-8
    character is incomplete). A token is on the thinking side when thinking was open before it or is open
    after it; tokens that only wrote the start of a start marker (harmony's ``<|channel|>``, ``analysis``)
    join the side the marker turns out to open. The budget counts thinking tokens after the start marker:
    the tokens that write it, and the one that closes thinking, are not thinking. With a budget of N the N-th
    thinking token is the last: its ``ForceStep.insert`` ends thinking. ``stop_thinking()`` asks for the same
    at the next token. A model that opens thinking again after a forced end is closed again at once.
    ``finish()`` at the end; ``metrics()`` at any time. Not thread-safe: call from the scheduler's thread.
    """

    def __init__(self, markers: ThinkingMarkers, budget_tokens: int | None = None,
                 deadline_s: float | None = None, answer_now: str | None = None, *, started_inside: bool = False,
                 t0: float = 0.0) -> None:
        ReasoningSettings(None, budget_tokens, deadline_s).validate()
        if answer_now is not None and not isinstance(answer_now, str):
            raise InvalidRequest(f"answer_now must be text, got {answer_now!r}", param="answer_now")
        self.markers = markers
        self.budget_tokens = budget_tokens
        self.deadline_s = deadline_s
        self.answer_now = answer_now
        self.t0 = t0
        self._split = ReasoningSplitter(markers, started_inside)
        self._used = 0  # thinking tokens counted against the budget
        self._stop = False
        self._reasoning_tokens = self._answer_tokens = 0
        self._undecided = 0  # answer-side tokens held as a possible start marker (harmony: <|channel|>)
        self._first_answer: Optional[float] = None
        self._think_from: Optional[float] = None
        self._think_to: Optional[float] = None
        self._last: Optional[float] = None
        self.forced = False
        self.stopped_by: Optional[str] = None
        self._finished = False

    @property
    def thinking(self) -> bool:
        """Thinking is open now."""
        return self._split.inside

    @property
    def splitter(self) -> ReasoningSplitter:
        return self._split

    def stop_thinking(self) -> bool:
        """Ask thinking to end at the next token (the window's button, ``POST .../stop_thinking``). True when
        it will (thinking is open, or has not opened yet: it is then closed as soon as it opens); False when
        thinking already ended or the request is finished."""
        if self._finished or self._split.closed and not self._split.inside:
            return False
        self._stop = True
        return True

    def step(self, text: str, now: float) -> ForceStep:
        """One sampled token's text at time ``now``; see the class. Raises RuntimeError after ``finish()``."""
        if self._finished:
            raise RuntimeError("step() after finish()")
        was_inside = self._split.inside
        pieces = self._split.feed(text)
        self._count(was_inside, self._split.inside, bool(pieces), now)
        if self._first_answer is None and any(isinstance(p, AnswerPiece) for p in pieces):
            self._first_answer = now
        reason = self._due(now) if self._split.inside else None
        if reason is None:
            return ForceStep(tuple(pieces))
        insert = self.markers.force_text(self.answer_now)
        pieces += self._split.feed(insert)
        self._think_to, self.forced = now, True  # a stop request stays: thinking reopened is closed again
        self.stopped_by = self.stopped_by or reason
        return ForceStep(tuple(pieces), insert, reason)

    def _count(self, was_inside: bool, inside: bool, gave_text: bool, now: float) -> None:
        self._last = now
        if not (was_inside or inside):
            if self._split.holding and not gave_text:  # all of it may be part of a marker: decided later
                self._undecided += 1
            else:
                self._answer_tokens += 1 + self._undecided
                self._undecided = 0
            return
        if not was_inside:  # this token opened thinking: it and the undecided ones before it wrote the marker
            self._reasoning_tokens += self._undecided
            self._undecided = 0
        self._reasoning_tokens += 1
        if self._think_from is None:
            self._think_from = now
        if was_inside and inside:
            self._used += 1
        elif was_inside:
            self._think_to = now

    def _due(self, now: float) -> str | None:
        if self._stop:
            return "user"
        if self.budget_tokens is not None and self._used >= self.budget_tokens:
            return "budget"
        if self.deadline_s is not None and now - self.t0 >= self.deadline_s:
            return "deadline"
        return None

    def finish(self) -> list[Piece]:
        """End the output: the held-back text's pieces (``ReasoningSplitter.finish``)."""
        self._finished = True
        return self._split.finish()

    def metrics(self) -> ReasoningMetrics:
        """The counts and times so far (``ReasoningMetrics``)."""
        thinking_s = 0.0
        if self._think_from is not None:
            end = self._think_to if self._think_to is not None and not self._split.inside else self._last
            thinking_s = max(0.0, (end or self._think_from) - self._think_from)
        ttfat = None if self._first_answer is None else self._first_answer - self.t0
        return ReasoningMetrics(self._reasoning_tokens, self._answer_tokens + self._undecided, ttfat, thinking_s,
                                self.forced, self.stopped_by, self._split.unclosed)
