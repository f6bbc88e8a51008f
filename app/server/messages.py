"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API on the chat machinery.

The same one mechanism as ``app.server.responses``: an Anthropic body is mapped onto a chat-completions body
(``chat_body``; ``output_config.format`` becomes ``response_format``) and runs through ``convert.chat_plan``
and ``Service``; ``MessagesAnswer`` writes the result as Anthropic content blocks and events;
``count_tokens`` renders the same plan's prompt and counts it with the model's tokenizer.

The reasoning: docs/server.md, 'app/server/messages.py'.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Literal, Optional, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError
from starlette.concurrency import run_in_threadpool

from app.engine.chat.tool_parser import ArgsPiece, CallStart, TextPiece
from app.engine.structured.grammar import check_bounds
from app.errors import InvalidRequest
from app.server import convert
from app.server import format as fmt
from app.server.convert import Plan
from app.server.errors import ApiError
from app.server.openai_schema import ChatCompletionRequest, HearthOptions
from app.server.service import ChoiceStart, Thought
from app.server.structured import check_schema, unenforceable

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
EFFORTS = ("low", "medium", "high", "xhigh", "max")  # output_config.effort: checked, not used


class MessageIn(BaseModel):
    """One Anthropic message (content checked block by block in ``chat_messages``)."""

    model_config = ConfigDict(extra="allow")
    role: Literal["user", "assistant"]
    content: Union[str, list[dict[str, Any]]]


class MessagesRequest(BaseModel):
    """``POST /v1/messages``'s body (docs/server.md, 'app/server/messages.py')."""

    model_config = ConfigDict(extra="allow")
    model: Optional[str] = None
    max_tokens: StrictInt = Field(..., description="required, as in Anthropic's API (a number, not a string)")
    messages: list[MessageIn]
    system: Optional[Union[str, list[dict[str, Any]]]] = None
    stop_sequences: Optional[list[str]] = None
    stream: StrictBool = False
    temperature: Optional[float] = Field(default=None, ge=0.0, le=1.0, strict=True)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0, strict=True)
    top_k: Optional[StrictInt] = Field(default=None, ge=0)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None
    output_config: Optional[dict[str, Any]] = None
    output_format: Optional[dict[str, Any]] = None
    metadata: Optional[dict[str, Any]] = None
    keep_alive: Any = None
    hearth: Optional[HearthOptions] = None


class CountTokensRequest(MessagesRequest):
    """``POST /v1/messages/count_tokens``' body: a Messages body without ``max_tokens`` (ignored if sent)."""

    max_tokens: Optional[StrictInt] = None  # type: ignore[assignment]


def chat_messages(body: MessagesRequest) -> list[dict[str, Any]]:
    """``system`` and ``messages`` as chat-completions messages; raises ``InvalidRequest`` naming
    ``messages[i].content[j]...``."""
    out: list[dict[str, Any]] = []
    if body.system:
        out.append({"role": "system", "content": _blocks_text(body.system, "system")})
    if not body.messages:
        raise InvalidRequest("messages must contain at least one message", param="messages")
    for i, m in enumerate(body.messages):
        at = f"messages[{i}].content"
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for j, b in enumerate(m.content):
            kind = b.get("type") if isinstance(b, dict) else None
            where = f"{at}[{j}]"
            if kind == "text" and isinstance(b.get("text"), str):
                texts.append(b["text"])
            elif kind == "tool_use" and m.role == "assistant":
                calls.append(_call(b, where))
            elif kind == "tool_result" and m.role == "user":
                out.append(_result(b, where))
            elif kind in ("thinking", "redacted_thinking") and m.role == "assistant":
                continue
            else:
                raise InvalidRequest(f"{where}: a {kind!r} block is not supported in a {m.role} message (text, "
                                     "tool_use in assistant messages, tool_result in user messages)", param=where)
        if calls:
            out.append({"role": "assistant", "content": "\n".join(texts) or None, "tool_calls": calls})
        elif texts or not m.content:
            out.append({"role": m.role, "content": "\n".join(texts)})
    return out


def _blocks_text(content: Any, at: str) -> str:
    """A string, or Anthropic text blocks joined with a newline (``convert.join_text``)."""
    return convert.join_text(content, at, ("text",), "text blocks")


def _call(b: dict, at: str) -> dict[str, Any]:
    args = b.get("input", {})
    if not isinstance(args, dict):
        raise InvalidRequest(f"{at}.input must be an object", param=f"{at}.input")
    if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
        raise InvalidRequest(f"{at} needs id and name", param=at)
    return {"id": b["id"], "type": "function",
            "function": {"name": b["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def _result(b: dict, at: str) -> dict[str, Any]:
    if not isinstance(b.get("tool_use_id"), str):
        raise InvalidRequest(f"{at}.tool_use_id is required", param=f"{at}.tool_use_id")
    text = _blocks_text(b.get("content", ""), f"{at}.content")
    if b.get("is_error"):
        text = "Error: " + text
    return {"role": "tool", "tool_call_id": b["tool_use_id"], "content": text}


def _tools(raw: Optional[list]) -> Optional[list]:
    if raw is None:
        return None
    out = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or t.get("type") not in (None, "custom") or "name" not in t:
            raise InvalidRequest(f"tools[{i}]: only custom tools with name and input_schema are supported",
                                 param=f"tools[{i}]")
        fn = {"name": t["name"], "parameters": t.get("input_schema") or {}}
        if t.get("description"):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(raw: Optional[dict]) -> tuple[Any, Optional[bool]]:
    """(chat ``tool_choice``, ``parallel_tool_calls``)."""
    if raw is None:
        return None, None
    kind = raw.get("type")
    choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if kind == "tool":
        choice = {"type": "function", "function": {"name": raw.get("name")}}
    if choice is None:
        raise InvalidRequest(f"tool_choice.type must be auto, any, tool or none, got {kind!r}",
                             param="tool_choice.type")
    return choice, (False if raw.get("disable_parallel_tool_use") else None)


def _output_format(body: MessagesRequest) -> Optional[dict]:
    """The chat ``response_format`` of ``output_config.format`` (structured outputs, ``{"type": "json_schema",
    "schema": {...}}``) or the older top-level ``output_format``; ``output_config.effort`` is checked and not
    used (thinking is asked for with ``thinking``, docs/server.md). The schema passes ``response_format``'s
    gates here, so errors name ``output_config.format``; Anthropic's structured outputs are guaranteed, so a
    keyword the grammar would not enforce is refused, not ignored. Raises ``InvalidRequest``."""
    cfg = body.output_config or {}
    param = "output_config.format" if cfg.get("format") is not None else "output_format"
    f = cfg.get("format") if cfg.get("format") is not None else body.output_format
    effort = cfg.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise InvalidRequest(f"output_config.effort must be one of {', '.join(EFFORTS)}, got {effort!r:.40}",
                             param="output_config.effort")
    if f is None:
        return None
    if not isinstance(f, dict) or f.get("type") != "json_schema":
        raise InvalidRequest(f'{param} must be {{"type": "json_schema", "schema": {{...}}}}, got {f!r:.80}',
                             param=f"{param}.type")
    schema = f.get("schema")
    check_schema(schema, f"{param}.schema", f"{param}.schema")
    check_bounds(schema, f"{param}.schema", f"{param}.schema")
    ignored = unenforceable(schema)
    if ignored:
        raise InvalidRequest(f"{param}.schema: the grammar cannot enforce " + ", ".join(ignored[:5])
                             + "; remove these keywords (the anthropic SDK's messages.parse does)",
                             param=f"{param}.schema")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}


def chat_body(body: MessagesRequest) -> ChatCompletionRequest:
    """The chat-completions request an Anthropic body means (``max_tokens`` None: a ``CountTokensRequest``,
    up to the end of the context). Raises ``InvalidRequest``."""
    if body.max_tokens is not None and body.max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be at least 1, got {body.max_tokens}", param="max_tokens")
    if body.hearth is not None and body.hearth.documents:
        raise InvalidRequest("hearth.documents is only supported on /v1/chat/completions", param="hearth.documents")
    choice, parallel = _tool_choice(body.tool_choice)
    hearth = body.hearth.model_dump(exclude_none=True) if body.hearth is not None else {}
    effort = None
    t = body.thinking or {}
    if t.get("type") == "enabled":
        budget = t.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise InvalidRequest(f"thinking.budget_tokens must be a whole number of tokens >= 0 when thinking is "
                                 f"enabled, got {budget!r}", param="thinking.budget_tokens")
        hearth.setdefault("reasoning_budget", budget)
    elif t.get("type") == "disabled":
        effort = "none"
    elif t:
        raise InvalidRequest("thinking.type must be enabled or disabled", param="thinking.type")
    response_format = _output_format(body)
    out = {"model": body.model, "messages": chat_messages(body), "max_tokens": body.max_tokens,
           "stop": body.stop_sequences, "stream": body.stream, "temperature": body.temperature,
           "top_p": body.top_p, "top_k": body.top_k, "tools": _tools(body.tools), "tool_choice": choice,
           "parallel_tool_calls": parallel, "reasoning_effort": effort, "response_format": response_format,
           "hearth": hearth or None}
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in out.items() if v is not None})
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None


def _sse(kind: str, obj: dict[str, Any]) -> bytes:
    return f"event: {kind}\n".encode() + fmt.sse({"type": kind, **obj})


def _usage(plan: Plan, choice: fmt.Choice) -> dict[str, Any]:
    u = fmt.usage(plan, [choice])
    return {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
            "cache_read_input_tokens": u["prompt_tokens_details"]["cached_tokens"],
            "cache_creation_input_tokens": 0}


def stop_of(plan: Plan, choice: fmt.Choice) -> tuple[str, Optional[str]]:
    """``(stop_reason, stop_sequence)`` of a finished choice: ``"stop_sequence"`` and the string when the
    engine reports (``Done.info["stop_sequence"]``) that one of the request's ``stop_sequences`` ended the
    answer; a template's own stop string or the end-of-turn token is ``end_turn``."""
    matched = choice.done.info.get("stop_sequence")
    asked = plan.requests[0].decoding.stop if plan.requests else ()
    if choice.finish_reason == "stop" and isinstance(matched, str) and matched in asked:
        return "stop_sequence", matched
    return STOP_REASONS.get(choice.finish_reason, "end_turn"), None


def content_blocks(choice: fmt.Choice) -> list[dict[str, Any]]:
    """A whole answer's blocks: thinking, text, tool_use (the order a stream opens them)."""
    blocks: list[dict[str, Any]] = []
    if choice.reasoning:
        blocks.append({"type": "thinking", "thinking": choice.reasoning, "signature": ""})
    calls = choice.tools.calls if choice.tools is not None else ()
    if choice.text or not calls:
        blocks.append({"type": "text", "text": choice.text})
    blocks.extend({"type": "tool_use", "id": c.id, "name": c.name, "input": _args(c.arguments)} for c in calls)
    return blocks


def _args(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return {}


@dataclass
class MessagesAnswer:
    """Writes one Anthropic message: the ``Answer`` of ``Service`` for /v1/messages."""

    def frame(self, plan: Plan) -> fmt.Frame:
        """A ``msg_…`` id."""
        import time

        return fmt.Frame(plan, "msg_" + uuid.uuid4().hex[:24], int(time.time()))

    def message(self, frame: fmt.Frame, content: list[dict], choice: Optional[fmt.Choice]) -> dict[str, Any]:
        """The ``message`` object (``choice`` None: the stream's start)."""
        out: dict[str, Any] = {"id": frame.id, "type": "message", "role": "assistant", "model": frame.plan.model,
                               "content": content, "stop_reason": None, "stop_sequence": None,
                               "usage": {"input_tokens": 0, "output_tokens": 0}}
        if choice is not None:
            out["stop_reason"], out["stop_sequence"] = stop_of(frame.plan, choice)
            out["usage"] = _usage(frame.plan, choice)
            out["hearth"] = fmt.choice_hearth(frame.plan, choice)
        return out

    async def whole(self, frame: fmt.Frame, choices: list[fmt.Choice], piece: Any) -> dict:
        """The whole message."""
        return self.message(frame, content_blocks(choices[0]), choices[0])

    async def stream(self, frame: fmt.Frame, pieces: AsyncIterator[Any], piece: Any) -> AsyncIterator[bytes]:
        """The event sequence of the module docstring."""
        yield _sse("message_start", {"message": self.message(frame, [], None)})
        blocks = _Blocks()
        async for p in pieces:
            if isinstance(p, ChoiceStart):
                continue
            if isinstance(p, fmt.Choice):
                for data in blocks.finish():
                    yield data
                stop, sequence = stop_of(frame.plan, p)
                yield _sse("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": sequence},
                                             "usage": _usage(frame.plan, p),
                                             "hearth": fmt.choice_hearth(frame.plan, p)})
                yield _sse("message_stop", {})
                continue
            for data in blocks.piece(p):
                yield data

    def error_event(self, err: ApiError) -> bytes:
        """An ``error`` event in Anthropic's shape."""
        return _sse("error", {"error": err.anthropic()["error"]})


class _Blocks:
    """The open content block and the events that open, feed and close blocks."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: Optional[str] = None

    def piece(self, p: Any) -> list[bytes]:
        if isinstance(p, Thought):
            return self._ensure("thinking", {"type": "thinking", "thinking": "", "signature": ""}) + [
                self._delta({"type": "thinking_delta", "thinking": p.text})]
        if isinstance(p, TextPiece):
            return self._ensure("text", {"type": "text", "text": ""}) + [
                self._delta({"type": "text_delta", "text": p.text})]
        if isinstance(p, CallStart):
            return self._open("tool_use", {"type": "tool_use", "id": p.id, "name": p.name, "input": {}})
        if isinstance(p, ArgsPiece):
            return [self._delta({"type": "input_json_delta", "partial_json": p.text})]
        return []

    def finish(self) -> list[bytes]:
        """Close the open block; an answer with no block gets an empty text block."""
        if self.index < 0:
            return self._ensure("text", {"type": "text", "text": ""}) + self._close()
        return self._close()

    def _delta(self, delta: dict) -> bytes:
        return _sse("content_block_delta", {"index": self.index, "delta": delta})

    def _ensure(self, kind: str, block: dict) -> list[bytes]:
        return [] if self.kind == kind else self._open(kind, block)

    def _open(self, kind: str, block: dict) -> list[bytes]:
        out = self._close()
        self.index += 1
        self.kind = kind
        return out + [_sse("content_block_start", {"index": self.index, "content_block": block})]

    def _close(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [_sse("content_block_stop", {"index": self.index})]


ANSWER = MessagesAnswer()


def count_tokens(engine: Any, plan: Plan) -> int:
    """Blocking: the tokens of the prompt ``plan``'s first request would be given (template applied, tools and
    the BOS token included), counted with ``engine``'s tokenizer (``Backend.render`` then ``tokenize``; a remote
    engine's count is its estimate)."""
    rendered = engine.render(plan.requests[0])
    return len(engine.tokenize(rendered.text, add_bos=rendered.add_bos, special=True))


def chat_plan(chat: ChatCompletionRequest, model: str, options: Any) -> Plan:
    """Blocking: ``convert.chat_plan`` of a Messages body's chat request, its errors naming the Messages API's
    own fields (``stop`` is ``stop_sequences`` here). Raises ``InvalidRequest``."""
    try:
        return convert.chat_plan(chat, model, options)
    except InvalidRequest as exc:
        if exc.param != "stop":
            raise
        raise InvalidRequest(exc.message.replace("stop strings", "stop sequences"), param="stop_sequences") from None


def routes(app: FastAPI, st: Any) -> None:
    """``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` on ``app`` (``st``: the app's ``State``)."""

    @app.post("/v1/messages")
    async def create_message(body: MessagesRequest, request: Request):
        chat = await run_in_threadpool(chat_body, body)
        held = await st.hold(body)

        async def plan() -> Plan:
            return await run_in_threadpool(chat_plan, chat, held.model, st.options(held.model))
        return await st.answer(held, plan, request, ANSWER)

    @app.post("/v1/messages/count_tokens")
    async def count_message_tokens(body: CountTokensRequest) -> dict:
        """``{"input_tokens": N}``: the prompt ``POST /v1/messages`` would give the model, in its tokens."""
        chat = await run_in_threadpool(chat_body, body)
        held = await st.hold(body)
        try:
            plan = await run_in_threadpool(chat_plan, chat, held.model, st.options(held.model))
            return {"input_tokens": await run_in_threadpool(count_tokens, held.engine, plan)}
        finally:
            held.release()
