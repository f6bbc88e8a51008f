"""Engine results → OpenAI response bodies and server-sent-event chunks (pure functions, no I/O).

SSE framing is exactly what the ``openai`` client parses: ``data: <json>\\n\\n`` (LF only), JSON without
ASCII escaping (UTF-8 on the wire), a final ``data: [DONE]``.

The reasoning: docs/server.md, 'app/server/format.py'.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from app.engine.chat.tool_parser import ArgsPiece, CallStart
from app.engine.chat.tool_stream import ToolOutcome
from app.protocol.types import Done
from app.server.convert import Plan

PieceFn = Callable[[int], bytes]  # token id -> the bytes of its text (``Engine.token_piece_bytes``)

DONE_EVENT = b"data: [DONE]\n\n"


@dataclass
class Choice:
    """One finished choice: its ``Done``, the per-token logprob entries, what max_tokens was clamped to (if
    it was) and the max_tokens it was given (None: up to the end of the context)."""

    done: Done
    logprobs: list[Any] = field(default_factory=list)
    clamped_to: Optional[int] = None
    max_tokens: Optional[int] = None
    tools: Optional[ToolOutcome] = None  # the answer read for tool calls (None: no tools were offered)
    consistency: Optional[dict[str, Any]] = None  # hearth.self_consistency (None: not asked for)
    samples: tuple[Done, ...] = ()  # with self-consistency: every sample's Done (they all cost)
    citations: Optional[list[dict[str, Any]]] = None  # hearth.citations, checked off the event loop (Service)
    attributions: Optional[list[dict[str, Any]]] = None  # hearth.attributions, the same way

    @property
    def text(self) -> str:
        """The answer's content: the text outside tool calls when tools were offered."""
        return self.tools.text if self.tools is not None else self.done.text

    @property
    def finish_reason(self) -> str:
        return self.tools.finish_reason if self.tools is not None else self.done.finish_reason

    @property
    def reasoning(self) -> str:
        """The thinking text ("" when the model did not think)."""
        return self.done.reasoning

    def spent(self) -> tuple[int, int]:
        """(completion tokens, of them thinking tokens) this choice cost: every sample's under
        self-consistency."""
        dones = self.samples or (self.done,)
        return (sum(d.metrics.completion_tokens for d in dones), sum(d.metrics.reasoning_tokens for d in dones))


@dataclass(frozen=True)
class Frame:
    """Identity shared by every chunk of one answer."""

    plan: Plan
    id: str
    created: int

    @classmethod
    def new(cls, plan: Plan) -> "Frame":
        prefix = "chatcmpl-" if plan.kind == "chat" else "cmpl-"
        return cls(plan, prefix + uuid.uuid4().hex[:24], int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion" if self.plan.kind == "chat" else "text_completion"

    def head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.plan.model,
                "system_fingerprint": None}


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


def hearth_meta(plan: Plan, choices: list[Choice]) -> dict[str, Any]:
    """The ``hearth`` object of a whole answer."""
    if len(choices) == 1:
        return choice_hearth(plan, choices[0])
    return {**_request_meta(plan), "choices": [_choice_meta(plan, c) for c in choices]}


def choice_hearth(plan: Plan, choice: Choice) -> dict[str, Any]:
    """One choice's whole ``hearth`` object, flat: a one-choice answer's, and each choice's last chunk's."""
    return {**_choice_meta(plan, choice), **_request_meta(plan)}


def _request_meta(plan: Plan) -> dict[str, Any]:
    return plan.grounding.given() if plan.grounding is not None else {}


def _choice_meta(plan: Plan, choice: Choice) -> dict[str, Any]:
    info = choice.done.info
    m = choice.done.metrics
    metrics = {**m.to_dict(), "acceptance_rate": m.acceptance_rate, "stopped_by": info.get("stopped_by")}
    meta = {"template": info.get("template"), "model_file": info.get("model"), "metrics": metrics,
            "context": context(plan, choice)}
    if info.get("tool_format"):
        meta["tool_format"] = info["tool_format"]
    if choice.tools is not None and choice.tools.errors:
        meta["tool_call_error"] = tool_call_error(choice.tools)
    if plan.grounding is not None:
        meta["citations"] = citations(plan, choice)
        meta["attributions"] = attributions(plan, choice)
    if choice.consistency is not None:
        meta["self_consistency"] = choice.consistency
    return meta


def citations(plan: Plan, choice: Choice) -> list[dict[str, Any]]:
    """``hearth.citations``: the passages the choice's answer cites, each checked against the sentence citing
    it (``Grounding.checked_citations``: ``supported``, ``sentence_start`` / ``sentence_end`` as str indices
    into the answer's content, ``support``). ``choice.citations`` when the service checked them already (the
    check may embed: it runs on the thread pool, once per choice, however many bodies carry it)."""
    if choice.citations is None:
        choice.citations = plan.grounding.checked_citations(choice.text)
    return choice.citations


def attributions(plan: Plan, choice: Choice) -> list[dict[str, Any]]:
    """``hearth.attributions``: each claim sentence of the choice's answer attributed to the passage given that
    best supports it (or to none), its facts checked, whether or not it cites (``Grounding.attributions``:
    ``sentence_start`` / ``sentence_end`` as str indices into the content, ``evidence_id``, ``path``, ``page``,
    ``supported``, ``support`` with ``reason``). ``choice.attributions`` when the service computed them."""
    if choice.attributions is None:
        choice.attributions = plan.grounding.attributions(choice.text)
    return choice.attributions


def tool_call_error(outcome: ToolOutcome) -> dict[str, Any]:
    """``hearth.tool_call_error``: why the answer's calls were not passed on (``message``, one line) and each
    failed call (``index`` and ``name`` when known, ``reason``, ``raw``: the model's text of it)."""
    return {"message": outcome.error_message,
            "errors": [{"index": e.index, "name": e.name, "reason": e.reason, "raw": e.raw} for e in outcome.errors]}


def context(plan: Plan, choice: Choice) -> dict[str, Any]:
    """Where the context went, in tokens: the prompt (evidence and tools included), the evidence block, the
    tool definitions (``tools``, only when the request offered tools), the answer's limit (after clamping;
    None: up to the end of the context) and what is left (``free`` = n_ctx − prompt − max_tokens, the rule of
    ``app.memory.context``; 0 when the answer may take the rest)."""
    n_ctx = choice.done.info.get("n_ctx")
    prompt = choice.done.metrics.prompt_tokens
    limit = choice.clamped_to if choice.clamped_to is not None else choice.max_tokens
    free = None if n_ctx is None else max(0, n_ctx - prompt - (limit if limit is not None else n_ctx))
    out = {"prompt_tokens": prompt, "evidence": plan.grounding.tokens if plan.grounding is not None else 0,
           "max_tokens": limit, "max_tokens_clamped": choice.clamped_to is not None, "n_ctx": n_ctx, "free": free}
    if "tools_tokens" in choice.done.info:
        out["tools"] = choice.done.info["tools_tokens"]
    return out


def usage(plan: Plan, choices: list[Choice]) -> dict[str, Any]:
    """Each prompt's tokens counted once (n choices share a prompt), generated tokens summed (every sample's
    under self-consistency), and of them the thinking tokens."""
    seen: dict[int, Choice] = {}
    for idx, c in zip(plan.prompt_index, choices):
        seen.setdefault(idx, c)
    prompt = sum(c.done.metrics.prompt_tokens for c in seen.values())
    cached = sum(c.done.metrics.cached_tokens for c in seen.values())
    spent = [c.spent() for c in choices]
    completion = sum(t for t, _ in spent)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": sum(r for _, r in spent)}}


# -- whole answers ----------------------------------------------------------------------------------------
def response(frame: Frame, choices: list[Choice], piece: Optional[PieceFn]) -> dict[str, Any]:
    plan = frame.plan
    out = []
    for i, c in enumerate(choices):
        lp = logprobs(plan, c.logprobs, piece) if plan.logprobs is not None and piece else None
        if plan.kind == "chat":
            out.append({"index": i, "message": message(c), "logprobs": lp, "finish_reason": c.finish_reason})
        else:
            ch = {"index": i, "text": c.done.text, "logprobs": lp, "finish_reason": c.done.finish_reason}
            if c.reasoning:
                ch["reasoning_content"] = c.reasoning
            out.append(ch)
    body = {**frame.head(frame.object), "choices": out, "usage": usage(plan, choices)}
    body["hearth"] = hearth_meta(plan, choices)
    return body


def message(c: Choice) -> dict[str, Any]:
    """A chat choice's ``message``: content null when the answer is only tool calls; ``reasoning_content``
    only when the model thought."""
    calls = c.tools.calls if c.tools is not None else ()
    msg: dict[str, Any] = {"role": "assistant", "content": c.text if c.text or not calls else None, "refusal": None}
    if c.reasoning:
        msg["reasoning_content"] = c.reasoning
    if calls:
        msg["tool_calls"] = [call.to_openai() for call in calls]
    return msg


# -- stream chunks ----------------------------------------------------------------------------------------
def tool_call_delta(piece: CallStart | ArgsPiece) -> dict[str, Any]:
    """A ``delta.tool_calls`` item: a call's start (index, id, type, name, ``arguments: ""``) or a piece of
    its arguments (index and the text)."""
    if isinstance(piece, CallStart):
        return {"index": piece.index, "id": piece.id, "type": "function",
                "function": {"name": piece.name, "arguments": ""}}
    return {"index": piece.index, "function": {"arguments": piece.text}}


def chunk(frame: Frame, index: int, *, text: Optional[str] = None, role: bool = False,
          finish: Optional[str] = None, lp: Optional[dict] = None, hearth: Optional[dict] = None,
          tool_calls: Optional[list[dict[str, Any]]] = None, reasoning: Optional[str] = None) -> bytes:
    """One SSE chunk of choice ``index``: answer ``text``, thinking ``reasoning`` (``delta.reasoning_content``),
    the role opening, tool-call items, the finish reason and the ``hearth`` object, as given."""
    plan = frame.plan
    if plan.kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta = {"role": "assistant", "content": ""}
        if text is not None:
            delta["content"] = text
        if reasoning is not None:
            delta["reasoning_content"] = reasoning
        if tool_calls:
            delta["tool_calls"] = tool_calls
        ch = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        obj = frame.head("chat.completion.chunk")
    else:
        ch = {"index": index, "text": text or "", "logprobs": lp, "finish_reason": finish}
        if reasoning is not None:
            ch["reasoning_content"] = reasoning
        obj = frame.head("text_completion")
    obj["choices"] = [ch]
    if plan.include_usage:
        obj["usage"] = None
    if hearth is not None:
        obj["hearth"] = hearth
    return sse(obj)


def usage_chunk(frame: Frame, choices: list[Choice]) -> bytes:
    obj = frame.head("chat.completion.chunk" if frame.plan.kind == "chat" else "text_completion")
    obj["choices"] = []
    obj["usage"] = usage(frame.plan, choices)
    return sse(obj)


def error_event(error: dict[str, Any]) -> bytes:
    """An error after the stream began: the ``openai`` client raises ``APIError`` on it."""
    return sse({"error": error})


# -- logprobs ---------------------------------------------------------------------------------------------
def token_text(b: bytes) -> str:
    """OpenAI's convention: the token's text, or ``bytes:\\xe2\\x80`` for a partial UTF-8 sequence."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{x:02x}" for x in b)


def logprobs(plan: Plan, entries: list[Any], piece: PieceFn, offset: int = 0) -> dict[str, Any]:
    """``entries``: the engine's ``(token_id, logprob, [(token_id, logprob), ...])`` per token."""
    k = plan.logprobs or 0
    if plan.kind == "chat":
        return {"content": [_chat_token(e, piece, k) for e in entries], "refusal": None}
    tokens, lps, tops, offsets = [], [], [], []
    for tid, lp, alts in entries:
        text = token_text(piece(tid))
        tokens.append(text)
        lps.append(lp)
        tops.append({token_text(piece(t)): v for t, v in alts[:k]} if k else None)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops if k else None, "text_offset": offsets}


def _chat_token(entry: Any, piece: PieceFn, k: int) -> dict[str, Any]:
    tid, lp, alts = entry
    b = piece(tid)
    return {"token": token_text(b), "logprob": lp, "bytes": list(b),
            "top_logprobs": [{"token": token_text(piece(t)), "logprob": v, "bytes": list(piece(t))}
                             for t, v in alts[:k]]}
