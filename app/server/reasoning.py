"""Thinking, speculative decoding and self-consistency fields of a request → the engine's values.

The port only *reads* these fields; what they mean lives in the core (docs/reasoning.md):

The reasoning: docs/server.md, 'app/server/reasoning.py'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

from app.engine.policies.consistency import SelfConsistencySpec, parse_self_consistency
from app.engine.policies.self_consistency import check_sampling
from app.errors import InvalidRequest
from app.protocol.reasoning import P_EFFORT, resolve_budget
from app.protocol.types import GenerateRequest, ReasoningRequest

Defaults = Union[Mapping[str, Any], Callable[[str], Optional[Mapping[str, Any]]], None]


@dataclass(frozen=True)
class PortOptions:
    """What the server adds to every request it reads: the loaded model's reasoning default (a mapping with
    ``reasoning_effort`` / ``reasoning_budget`` / ``reasoning_deadline_s``, or None) and whether a
    self-consistency ``command`` verifier may run."""

    reasoning_default: Optional[Mapping[str, Any]] = None
    allow_command: bool = False


def model_default(defaults: Defaults, model: str) -> Optional[Mapping[str, Any]]:
    """The reasoning default of ``model`` (the loaded model's id): ``defaults`` is one mapping for every
    model, a callable ``model_id -> mapping | None``, or None."""
    if defaults is None:
        return None
    return defaults(model) if callable(defaults) else defaults


def reasoning_request(body: Any, options: PortOptions) -> Optional[ReasoningRequest]:
    """``GenerateRequest.reasoning`` for ``body`` (a chat or completion request); None when neither the
    request nor the model's default says anything. Raises ``InvalidRequest`` naming ``reasoning_effort``,
    ``hearth.reasoning_budget``, ``hearth.reasoning_deadline_s`` or ``hearth.answer_now``."""
    h = body.hearth
    effort = body.reasoning_effort
    tokens = h.reasoning_budget if h is not None else None
    deadline = h.reasoning_deadline_s if h is not None else None
    answer_now = h.answer_now if h is not None else None
    if effort is not None and not isinstance(effort, str):
        raise InvalidRequest(f"{P_EFFORT} must be one of none, low, medium, high, got {effort!r}"[:200],
                             param=P_EFFORT)
    default = options.reasoning_default
    if effort is None and tokens is None and deadline is None and answer_now is None and not default:
        return None
    budget = resolve_budget(effort, tokens, deadline, per_conversation=None, per_model_default=default)
    return ReasoningRequest(budget, answer_now).validate()


def speculative(body: Any) -> Optional[str]:
    """``hearth.speculative`` as sent (checked by ``GenerateRequest.validate``)."""
    return body.hearth.speculative if body.hearth is not None else None


def self_consistency(body: Any, options: PortOptions, request: GenerateRequest, *, prompts: int = 1,
                     logprobs: bool = False, tools: bool = False) -> Optional[SelfConsistencySpec]:
    """The parsed ``hearth.self_consistency`` (None when absent), checked against the rest of the request
    (``request``: the engine request every sample would run; see the module docstring for what it cannot be
    combined with)."""
    raw = body.hearth.self_consistency if body.hearth is not None else None
    if raw is None:
        return None
    spec = parse_self_consistency(raw, allow_command=options.allow_command)
    conflicts = [
        (body.n > 1, "n", "hearth.self_consistency already samples n answers and returns one; send n: 1 (or "
                          "leave it out)"),
        (body.stream, "stream", "hearth.self_consistency is not supported with stream: true (the voted answer "
                                "is known only when every sample has ended); send stream: false"),
        (tools, "tools", "hearth.self_consistency votes over text answers and cannot be combined with tools"),
        (logprobs, "logprobs", "hearth.self_consistency does not report logprobs"),
        (prompts > 1, "prompt", "hearth.self_consistency takes one prompt per request"),
    ]
    for bad, param, message in conflicts:
        if bad:
            raise InvalidRequest(message, param=param)
    check_sampling(request, spec)  # temperature 0 with n > 1 samples
    return spec
