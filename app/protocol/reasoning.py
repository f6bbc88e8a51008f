"""Thinking budgets, the values: the three layers of settings (request, conversation, model) and the budget a
request runs with (``ReasoningBudget``), resolved by ``resolve_budget``. Budget forcing itself is
``app.engine.chat.reasoning_budget``; why the effort levels are what they are is docs/reasoning.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Union

from app.errors import InvalidRequest

EFFORT_TOKENS = {"none": 0, "low": 256, "medium": 1024, "high": 4096}
MAX_BUDGET_TOKENS = 1 << 20
MAX_DEADLINE_S = 1e6
STOPPED_BY = ("budget", "deadline", "user")
# Request fields, as the API names them (InvalidRequest.param).
P_EFFORT, P_BUDGET, P_DEADLINE = "reasoning_effort", "hearth.reasoning_budget", "hearth.reasoning_deadline_s"
# Keys of a conversation's or a model's reasoning settings.
SETTING_KEYS = {"reasoning_effort": P_EFFORT, "reasoning_budget": P_BUDGET, "reasoning_deadline_s": P_DEADLINE}
LAYERS = ("request", "conversation", "model")


# -- budgets --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReasoningSettings:
    """One layer's reasoning settings. ``effort``: none | low | medium | high; ``budget_tokens``: thinking
    tokens (>= 0); ``deadline_s``: seconds from the request's start (> 0). None: this layer does not say."""

    effort: str | None = None
    budget_tokens: int | None = None
    deadline_s: float | None = None

    def validate(self, layer: str = "request") -> "ReasoningSettings":
        """Raise ``InvalidRequest`` naming the field (``reasoning_effort``, ``hearth.reasoning_budget``,
        ``hearth.reasoning_deadline_s``), its range and the value received; return self."""
        whose = "" if layer == "request" else f"the {layer}'s "
        if self.effort is not None and self.effort not in EFFORT_TOKENS:
            raise InvalidRequest(f"{whose}{P_EFFORT} must be one of {', '.join(EFFORT_TOKENS)}, got "
                                 f"{self.effort!r}", param=P_EFFORT)
        if self.budget_tokens is not None:
            b = self.budget_tokens
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b <= MAX_BUDGET_TOKENS:
                raise InvalidRequest(f"{whose}{P_BUDGET} must be an integer >= 0 and <= {MAX_BUDGET_TOKENS} "
                                     f"(thinking tokens), got {b!r}", param=P_BUDGET)
        if self.deadline_s is not None:
            d = self.deadline_s
            if (isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d)
                    or not 0 < d <= MAX_DEADLINE_S):
                raise InvalidRequest(f"{whose}{P_DEADLINE} must be a number > 0 and <= {MAX_DEADLINE_S:g} "
                                     f"(seconds), got {d!r}", param=P_DEADLINE)
        return self

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any] | None, layer: str = "conversation") -> "ReasoningSettings":
        """From stored settings with keys in ``SETTING_KEYS`` (None values: unset); validated. An unknown key
        raises ``InvalidRequest`` naming it."""
        d = dict(d or {})
        for key in d:
            if key not in SETTING_KEYS:
                raise InvalidRequest(f"the {layer}'s reasoning settings have an unknown key {key!r}; known: "
                                     f"{', '.join(SETTING_KEYS)}", param=key)
        return cls(d.get("reasoning_effort"), d.get("reasoning_budget"), d.get("reasoning_deadline_s")
                   ).validate(layer)

    @property
    def sets_tokens(self) -> bool:
        return self.budget_tokens is not None or self.effort is not None

    def tokens(self) -> int | None:
        """This layer's token budget: the explicit one, else its effort's, else None."""
        if self.budget_tokens is not None:
            return self.budget_tokens
        return None if self.effort is None else EFFORT_TOKENS[self.effort]


Layer = Union[ReasoningSettings, Mapping[str, Any], None]


@dataclass(frozen=True)
class ReasoningBudget:
    """The budget a request runs with.

    ``tokens``: thinking tokens allowed (0: no thinking; None: no token limit); ``deadline_s``: seconds from
    the request's start after which thinking is ended (None: none); ``effort``: the effort that set
    ``tokens`` (None when tokens were explicit or unset); ``source``: the layer that set ``tokens``
    ("request", "conversation", "model"; "none" when no layer did); ``requested``: ``tokens`` before ``fit``;
    ``capped``: ``fit`` lowered them."""

    tokens: int | None = None
    deadline_s: float | None = None
    effort: str | None = None
    source: str = "none"
    requested: int | None = None
    capped: bool = False

    @property
    def off(self) -> bool:
        """No thinking (budget 0 / effort none)."""
        return self.tokens == 0

    @property
    def asked(self) -> bool:
        """Some layer asked for a budget (a model that thinks only when prefilled then thinks)."""
        return self.source != "none" or self.deadline_s is not None

    def fit(self, n_ctx: int, prompt_tokens: int, max_tokens: int | None = None) -> "ReasoningBudget":
        """This budget kept to at most half of the context left after the prompt (``n_ctx - prompt_tokens``,
        in tokens), and to half of ``max_tokens`` when given (pass it when max_tokens counts thinking and
        answer together, as OpenAI's max_completion_tokens does). An unset budget gets the same cap, so a
        thinking model always leaves room to answer. Raises ``InvalidRequest`` (param n_ctx / prompt_tokens /
        max_tokens) for a negative or non-integer count."""
        for name, v in (("n_ctx", n_ctx), ("prompt_tokens", prompt_tokens), ("max_tokens", max_tokens)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise InvalidRequest(f"{name} must be an integer >= 0, got {v!r}", param=name)
        cap = max(0, n_ctx - prompt_tokens) // 2
        if max_tokens is not None:
            cap = min(cap, max_tokens // 2)
        tokens = cap if self.tokens is None else min(self.tokens, cap)
        return replace(self, tokens=tokens, requested=self.tokens, capped=self.tokens is None or tokens < self.tokens)


def _layer(value: Layer, layer: str) -> ReasoningSettings:
    if value is None:
        return ReasoningSettings()
    if isinstance(value, ReasoningSettings):
        return value.validate(layer)
    return ReasoningSettings.from_mapping(value, layer)


def resolve_budget(effort: str | None = None, budget_tokens: int | None = None, deadline_s: float | None = None,
                   per_conversation: Layer = None, per_model_default: Layer = None) -> ReasoningBudget:
    """The request's budget: request > conversation > model default, for tokens and for the deadline apart.

    The first three arguments are the request's fields; ``per_conversation`` / ``per_model_default`` are
    ``ReasoningSettings`` or mappings with ``SETTING_KEYS``. In one layer ``budget_tokens`` beats ``effort``.
    Raises ``InvalidRequest`` naming ``reasoning_effort``, ``hearth.reasoning_budget`` or
    ``hearth.reasoning_deadline_s`` for a bad value in any layer."""
    layers = [(ReasoningSettings(effort, budget_tokens, deadline_s).validate("request"), "request"),
              (_layer(per_conversation, "conversation"), "conversation"),
              (_layer(per_model_default, "model"), "model")]
    tokens_from = next(((s, name) for s, name in layers if s.sets_tokens), None)
    deadline = next((s.deadline_s for s, _ in layers if s.deadline_s is not None), None)
    if tokens_from is None:
        return ReasoningBudget(None, deadline)
    s, name = tokens_from
    return ReasoningBudget(s.tokens(), deadline, s.effort if s.budget_tokens is None else None, name, s.tokens())
