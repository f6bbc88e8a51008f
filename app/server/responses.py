"""``/v1/responses``: OpenAI's Responses API on the chat machinery, chained through the conversation store.

The reasoning: docs/server.md, 'app/server/responses.py'.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from app.engine.chat.tool_parser import ArgsPiece, CallStart, TextPiece
from app.engine.structured.grammar import check_bounds
from app.errors import InvalidRequest, StoreError
from app.protocol.types import ChatMessage
from app.server import convert
from app.server import format as fmt
from app.server.convert import Plan
from app.server.errors import ApiError, ResponseNotFound
from app.server.openai_schema import ChatCompletionRequest, ResponsesRequest
from app.server.service import ChoiceStart, Thought

_ID = re.compile(r"^resp_([0-9a-f]{32})[0-9a-f]{16}$")
_ROLES = ("user", "assistant", "system", "developer")
_PASS = ("top_k", "min_p", "typical_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "seed", "stop",
         "logit_bias")  # llama.cpp-style sampling fields a client may add (extra_body)


# -- chains ---------------------------------------------------------------------------------------------------
@dataclass
class Chain:
    """Where a response goes in the store: its conversation, the message it answers after (None: a new
    conversation's first), and the history given to the model."""

    conversation_id: str
    parent_id: Optional[str] = None
    history: list[dict[str, Any]] = field(default_factory=list)
    new: bool = True


class ResponseChains:
    """``previous_response_id`` over an ``app.memory.Store`` (module docstring). ``store`` None: an in-memory
    store of its own."""

    def __init__(self, store: Any = None) -> None:
        self._store = store
        self._lock = threading.Lock()  # the settings mapping is read, changed and written back

    @property
    def store(self) -> Any:
        """The store, opened on first use."""
        if self._store is None:
            from app.memory import Store

            self._store = Store(":memory:")
        return self._store

    def chain(self, previous_id: Optional[str]) -> Chain:
        """The chain a new response joins (blocking: reads the store). Raises ``ResponseNotFound``."""
        if previous_id is None:
            return Chain(uuid.uuid4().hex)  # an empty string is an id like any other: not found
        cid, mid, _ = self._entry(previous_id, "previous_response_id")
        try:
            path = self.store.path_to(mid)
        except StoreError:
            path = None
        if not path:
            raise ResponseNotFound(previous_id)
        return Chain(cid, path[-1].id, [_stored_message(x) for x in path], new=False)

    def get(self, response_id: str) -> dict[str, Any]:
        """The stored ``response`` object (blocking). An entry kept before responses were stored (a bare
        message id) is rebuilt from its assistant message (``rebuilt``). Raises ``ResponseNotFound``."""
        _, mid, response = self._entry(response_id, "response_id")
        if response is not None:
            return response
        try:
            return rebuilt(response_id, self.store.get_message(mid))
        except StoreError:
            raise ResponseNotFound(response_id, "response_id") from None

    def delete(self, response_id: str) -> dict[str, Any]:
        """Forget ``response_id`` (blocking): its mapping goes, its conversation's messages stay. Raises
        ``ResponseNotFound``."""
        with self._lock:
            cid, _, _ = self._entry(response_id, "response_id")
            settings = self.store.get_conversation(cid).settings
            del settings["responses"][response_id]
            self.store.update_conversation(cid, settings=settings)
        return {"id": response_id, "object": "response", "deleted": True}

    def _entry(self, response_id: str, param: str) -> tuple[str, str, Optional[dict[str, Any]]]:
        """``(conversation id, assistant message id, stored response or None)`` of a response id; a
        malformed, unknown or deleted one raises ``ResponseNotFound`` naming ``param``."""
        m = _ID.match(response_id)
        entry: Any = None
        if m is not None:
            try:
                entries = self.store.get_conversation(m.group(1)).settings.get("responses")
            except StoreError:
                entries = None
            entry = entries.get(response_id) if isinstance(entries, dict) else None
        if isinstance(entry, str):  # the old format: the message id alone
            return m.group(1), entry, None
        if isinstance(entry, dict) and isinstance(entry.get("message_id"), str):
            response = entry.get("response")
            return m.group(1), entry["message_id"], response if isinstance(response, dict) else None
        raise ResponseNotFound(response_id, param)

    @staticmethod
    def new_id(chain: Chain) -> str:
        """A response id in ``chain``'s conversation."""
        return f"resp_{chain.conversation_id}{uuid.uuid4().hex[:16]}"

    def save(self, response_id: str, chain: Chain, new: list[ChatMessage], answer: ChatMessage, model: str,
             reasoning: str = "", response: Optional[dict[str, Any]] = None) -> str:
        """Append ``new`` and ``answer`` under the chain's tip and map ``response_id`` to the answer and the
        finished ``response`` object (blocking). Returns the answer's message id."""
        store = self.store
        with self._lock, store.transaction():  # all or nothing: a failed write leaves no empty conversation
            if chain.new:
                first = next((m.content for m in new if m.role == "user"), "")
                store.create_conversation(title=("API: " + first)[:80], model=model,
                                          settings={"origin": "api.responses", "responses": {}},
                                          conversation_id=chain.conversation_id)
            parent = chain.parent_id
            for m in new:
                parent = store.append_message(chain.conversation_id, m.role, m.content, parent,
                                              tool_calls=m.tool_calls, tool_call_id=m.tool_call_id, name=m.name)
            mid = store.append_message(chain.conversation_id, "assistant", answer.content, parent,
                                       tool_calls=answer.tool_calls, reasoning=reasoning or None,
                                       meta={"model": model})
            settings = store.get_conversation(chain.conversation_id).settings
            entries = settings.get("responses")
            if not isinstance(entries, dict):
                entries = settings["responses"] = {}
            entries[response_id] = {"message_id": mid, "response": response}
            store.update_conversation(chain.conversation_id, model=model, settings=settings)
        chain.new = False
        return mid


def rebuilt(response_id: str, m: Any) -> dict[str, Any]:
    """A minimal ``response`` for an old-format entry, from its stored assistant message ``m``: its output
    items (ids derived from the response id, so two reads agree), model and time; what was never kept (usage,
    the request's instructions, tools, sampling, ``previous_response_id``) is null or the default, and
    ``hearth.rebuilt`` is true."""
    n = itertools.count()
    output = _items(m.reasoning or "", m.content, m.tool_calls, lambda p: f"{p}_{response_id[5:]}_{next(n)}")
    return {"id": response_id, "object": "response", "created_at": _epoch(m.created), "status": "completed",
            "error": None, "incomplete_details": None, "instructions": None, "max_output_tokens": None,
            "model": (m.meta or {}).get("model", ""), "output": output, "parallel_tool_calls": True,
            "previous_response_id": None, "reasoning": {"effort": None, "summary": None}, "store": True,
            "temperature": None, "top_p": None, "text": {"format": {"type": "text"}}, "tool_choice": "auto",
            "tools": [], "truncation": "disabled", "metadata": {}, "user": None, "usage": None,
            "hearth": {"rebuilt": True}}


def _epoch(iso: str) -> int:
    try:
        return int(datetime.fromisoformat(iso).timestamp())
    except (TypeError, ValueError):
        return 0


def _stored_message(m: Any) -> dict[str, Any]:
    """A stored ``app.memory.Message`` as a chat-completions message."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [c.to_openai() for c in m.tool_calls]
        out["content"] = m.content or None
    if m.role == "tool":
        out["tool_call_id"], out["name"] = m.tool_call_id, m.name
    return out


# -- the request ----------------------------------------------------------------------------------------------
def input_messages(raw: Any) -> list[dict[str, Any]]:
    """``input`` as chat-completions messages (module docstring); raises ``InvalidRequest`` naming
    ``input[i]...``."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not raw:
        raise InvalidRequest("input must not be empty", param="input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        at = f"input[{i}]"
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise InvalidRequest(f"{at}.role must be one of {', '.join(_ROLES)}, got {role!r}",
                                     param=f"{at}.role")
            out.append({"role": role, "content": _text(item.get("content"), f"{at}.content")})
        elif kind == "function_call":
            call = {"id": _str(item, "call_id", at), "type": "function",
                    "function": {"name": _str(item, "name", at), "arguments": item.get("arguments", "{}")}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
                out[-1]["content"] = out[-1]["content"] or None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{at}.output")
            out.append({"role": "tool", "tool_call_id": _str(item, "call_id", at), "content": text})
        elif kind != "reasoning":
            raise InvalidRequest(f"{at}.type {kind!r} is not supported (message, function_call, "
                                 "function_call_output, reasoning)", param=f"{at}.type")
    return out


def _text(content: Any, at: str) -> str:
    """A string, or text parts (``input_text``, ``output_text``, ``text``) joined with a newline
    (``convert.join_text``)."""
    return convert.join_text(content, at, ("input_text", "output_text", "text"), "text parts")


def _str(item: dict, key: str, at: str) -> str:
    v = item.get(key)
    if not isinstance(v, str) or not v:
        raise InvalidRequest(f"{at}.{key} must be a non-empty string", param=f"{at}.{key}")
    return v


def _tools(raw: Optional[list]) -> Optional[list]:
    if raw is None:
        return None
    out = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise InvalidRequest(f"tools[{i}].type {kind!r} is not supported; Hearth runs function tools only",
                                 param=f"tools[{i}].type")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(raw: Any) -> Any:
    if isinstance(raw, dict) and raw.get("type") == "function":
        return {"type": "function", "function": {"name": raw.get("name")}}
    return raw


def _format(text: Optional[dict]) -> Optional[dict]:
    if text is not None and not isinstance(text, dict):
        raise InvalidRequest(f"text must be an object like {{\"format\": {{\"type\": \"text\"}}}}, got {text!r:.80}",
                             param="text")
    f = (text or {}).get("format")
    if f is not None and not isinstance(f, dict):
        raise InvalidRequest(f'text.format must be an object like {{"type": "json_object"}}, got {f!r:.80}',
                             param="text.format")
    if not f or f.get("type") in (None, "text"):
        return None
    if f.get("type") == "json_schema":
        if isinstance(f.get("schema"), dict):
            check_bounds(f["schema"], "text.format.schema", "text.format.schema")
        return {"type": "json_schema", "json_schema": {k: f[k] for k in ("name", "schema", "strict", "description")
                                                       if k in f}}
    return {"type": f.get("type")}


def chat_body(body: ResponsesRequest, history: list[dict[str, Any]]) -> tuple[ChatCompletionRequest, int]:
    """The chat-completions request a Responses body means, after ``history``, and how many of its messages
    come before the new input (instructions and history). Raises ``InvalidRequest``."""
    if body.hearth is not None and body.hearth.documents:
        raise InvalidRequest("hearth.documents is only supported on /v1/chat/completions", param="hearth.documents")
    if body.max_output_tokens is not None and body.max_output_tokens < 1:
        raise InvalidRequest(f"max_output_tokens must be at least 1, got {body.max_output_tokens}",
                             param="max_output_tokens")
    lead = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + history
    out: dict[str, Any] = {
        "model": body.model, "messages": lead + input_messages(body.input), "stream": body.stream,
        "max_completion_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
        "tools": _tools(body.tools), "tool_choice": _tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls, "response_format": _format(body.text),
        "reasoning_effort": (body.reasoning or {}).get("effort"),
        "hearth": body.hearth.model_dump(exclude_none=True) if body.hearth is not None else None}
    extra = body.model_extra or {}
    out.update({k: extra[k] for k in _PASS if k in extra})
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in out.items() if v is not None}), len(lead)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None


# -- the answer -----------------------------------------------------------------------------------------------
@dataclass
class ResponsesAnswer:
    """Writes one response: the ``Answer`` of ``Service`` for /v1/responses (module docstring)."""

    body: ResponsesRequest
    chains: ResponseChains
    chain: Chain
    lead: int  # messages before the new input
    response_id: str = ""
    created: int = 0
    _sent: Optional[tuple[fmt.Frame, "_EventWriter"]] = None  # the stream's frame and writer, for its error

    def __post_init__(self) -> None:
        self.response_id = ResponseChains.new_id(self.chain)
        self.created = int(time.time())

    def frame(self, plan: Plan) -> fmt.Frame:
        """The response's id (``resp_…``)."""
        return fmt.Frame(plan, self.response_id, self.created)

    async def whole(self, frame: fmt.Frame, choices: list[fmt.Choice], piece: Any) -> dict:
        """The ``response`` object, stored first unless ``store: false``."""
        choice = choices[0]
        out = self.response(frame, output_items(choice), choice)
        await self._save(frame, choice, out)
        return out

    def response(self, frame: fmt.Frame, output: list[dict], choice: Optional[fmt.Choice]) -> dict:
        """The ``response`` object (``choice`` None: still in progress)."""
        b = self.body
        status = "in_progress" if choice is None else (
            "incomplete" if choice.finish_reason == "length" else "completed")
        out: dict[str, Any] = {
            "id": frame.id, "object": "response", "created_at": frame.created, "status": status, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": b.instructions, "max_output_tokens": b.max_output_tokens, "model": frame.plan.model,
            "output": output, "parallel_tool_calls": b.parallel_tool_calls is not False,
            "previous_response_id": b.previous_response_id, "reasoning": {"effort": (b.reasoning or {}).get("effort"),
                                                                          "summary": None},
            "store": b.store, "temperature": b.temperature, "top_p": b.top_p,
            "text": b.text or {"format": {"type": "text"}}, "tool_choice": b.tool_choice or "auto",
            "tools": b.tools or [], "truncation": "disabled", "metadata": b.metadata or {}, "user": b.user,
            "usage": None}
        if choice is not None:
            out["usage"] = usage(frame.plan, choice)
            out["hearth"] = fmt.choice_hearth(frame.plan, choice)
        return out

    async def _save(self, frame: fmt.Frame, choice: fmt.Choice, response: dict[str, Any]) -> None:
        if not self.body.store:
            return
        msgs = frame.plan.requests[0].messages or ()
        calls = choice.tools.calls if choice.tools is not None else ()
        answer = ChatMessage("assistant", choice.text, tuple(calls))
        await run_in_threadpool(self.chains.save, frame.id, self.chain, list(msgs[self.lead:]), answer,
                                frame.plan.model, choice.reasoning, response)

    async def stream(self, frame: fmt.Frame, pieces: AsyncIterator[Any], piece: Any) -> AsyncIterator[bytes]:
        """The event sequence of the module docstring."""
        w = _EventWriter()
        self._sent = (frame, w)
        yield w.event("response.created", response=self.response(frame, [], None))
        yield w.event("response.in_progress", response=self.response(frame, [], None))
        async for p in pieces:
            if isinstance(p, ChoiceStart):
                continue
            if isinstance(p, fmt.Choice):
                for data in w.finish():
                    yield data
                final = self.response(frame, w.items, p)
                await self._save(frame, p, final)
                yield w.event("response.incomplete" if final["status"] == "incomplete" else "response.completed",
                              response=final)
                continue
            for data in w.piece(p):
                yield data

    def error_event(self, err: ApiError) -> bytes:
        """How a stream that fails ends, as OpenAI's does: ``response.failed`` (the response so far, ``status``
        "failed" and its ``error``), then an ``error`` event, both numbered on from the events already sent."""
        if self._sent is None:  # failed before the stream began: a writer of its own
            return _EventWriter().event("error", code=err.code, message=err.message, param=err.param)
        frame, w = self._sent
        failed = {**self.response(frame, w.items, None), "status": "failed",
                  "error": {"code": err.code or "server_error", "message": err.message}}
        return (w.event("response.failed", response=failed)
                + w.event("error", code=err.code, message=err.message, param=err.param))


def usage(plan: Plan, choice: fmt.Choice) -> dict[str, Any]:
    """Responses' usage: input / output tokens with cached and reasoning tokens."""
    u = fmt.usage(plan, [choice])
    return {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
            "total_tokens": u["total_tokens"],
            "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens_details": {"reasoning_tokens": u["completion_tokens_details"]["reasoning_tokens"]}}


def output_items(choice: fmt.Choice) -> list[dict[str, Any]]:
    """A whole answer's output items: its thinking, its text, its calls (the order a stream opens them)."""
    return _items(choice.reasoning, choice.text, choice.tools.calls if choice.tools is not None else (), _item_id)


def _items(reasoning: str, text: str, calls: Any, item_id: Callable[[str], str]) -> list[dict[str, Any]]:
    items = []
    if reasoning:
        items.append(_reasoning_item(item_id("rs"), reasoning))
    if text or not calls:
        items.append(_message_item(item_id("msg"), text, "completed"))
    items.extend(_call_item(item_id("fc"), c.id, c.name, c.arguments, "completed") for c in calls)
    return items


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _reasoning_item(iid: str, text: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"type": "reasoning", "id": iid, "summary": [], "content": content, "status": "completed"}


def _message_item(iid: str, text: Optional[str], status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {"type": "message", "id": iid, "status": status, "role": "assistant", "content": content}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(iid: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": iid, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def _sse(kind: str, obj: dict[str, Any]) -> bytes:
    return f"event: {kind}\n".encode() + fmt.sse(obj)


class _EventWriter:
    """The open output item and the events that open, feed and close items (one item open at a time)."""

    def __init__(self) -> None:
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # finished items, in output order
        self.open: Optional[dict[str, Any]] = None
        self.text = ""

    def event(self, kind: str, **fields: Any) -> bytes:
        obj = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return _sse(kind, obj)

    def piece(self, p: Any) -> list[bytes]:
        """The events of one piece (thinking, text, a call's start or arguments)."""
        if isinstance(p, Thought):
            return self._ensure("reasoning") + [self._delta("response.reasoning_text.delta", p.text)]
        if isinstance(p, TextPiece):
            return self._ensure("message") + [self._delta("response.output_text.delta", p.text, logprobs=[])]
        if isinstance(p, CallStart):
            out = self._close()
            self.open, self.text = _call_item(_item_id("fc"), p.id, p.name, "", "in_progress"), ""
            return out + [self.event("response.output_item.added", output_index=len(self.items), item=self.open)]
        if isinstance(p, ArgsPiece):
            self.text += p.text
            return [self.event("response.function_call_arguments.delta", item_id=self.open["id"],
                               output_index=len(self.items), delta=p.text)]
        return []

    def finish(self) -> list[bytes]:
        """Close the open item; an answer with no item at all gets an empty message."""
        out = self._close()
        if not self.items:
            out = self._ensure("message") + self._close()
        return out

    def _delta(self, kind: str, text: str, **extra: Any) -> bytes:
        self.text += text
        return self.event(kind, item_id=self.open["id"], output_index=len(self.items), content_index=0,
                          delta=text, **extra)

    def _ensure(self, kind: str) -> list[bytes]:
        if self.open is not None and self.open["type"] == kind:
            return []
        out = self._close()
        self.text = ""
        if kind == "reasoning":
            self.open = {"type": "reasoning", "id": _item_id("rs"), "summary": [], "content": [],
                         "status": "in_progress"}
        else:
            self.open = _message_item(_item_id("msg"), None, "in_progress")
        at = {"output_index": len(self.items)}
        out.append(self.event("response.output_item.added", **at, item=self.open))
        if kind == "message":
            out.append(self.event("response.content_part.added", item_id=self.open["id"], **at, content_index=0,
                                  part=_text_part("")))
        return out

    def _close(self) -> list[bytes]:
        item, self.open = self.open, None
        if item is None:
            return []
        at = {"item_id": item["id"], "output_index": len(self.items)}
        out = []
        if item["type"] == "message":
            item = _message_item(item["id"], self.text, "completed")
            out.append(self.event("response.output_text.done", **at, content_index=0, text=self.text, logprobs=[]))
            out.append(self.event("response.content_part.done", **at, content_index=0, part=item["content"][0]))
        elif item["type"] == "reasoning":
            item = _reasoning_item(item["id"], self.text)
            out.append(self.event("response.reasoning_text.done", **at, content_index=0, text=self.text))
        else:
            item = _call_item(item["id"], item["call_id"], item["name"], self.text, "completed")
            out.append(self.event("response.function_call_arguments.done", **at, name=item["name"],
                                  arguments=self.text))
        out.append(self.event("response.output_item.done", output_index=len(self.items), item=item))
        self.items.append(item)
        return out


def routes(app: FastAPI, st: Any) -> None:
    """``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{response_id}`` on ``app`` (``st``: the
    app's ``State``)."""

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str, stream: Optional[str] = None):
        if stream not in (None, "false", "False", "0"):
            raise InvalidRequest("stream is not supported on GET /v1/responses/{response_id}: a stored response "
                                 "is returned whole", param="stream")
        return await run_in_threadpool(st.chains.get, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        return await run_in_threadpool(st.chains.delete, response_id)

    @app.post("/v1/responses")
    async def create_response(body: ResponsesRequest, request: Request):
        chain = await run_in_threadpool(st.chains.chain, body.previous_response_id)
        chat, lead = await run_in_threadpool(chat_body, body, chain.history)
        held = await st.hold(body)

        async def plan() -> Plan:
            return await run_in_threadpool(convert.chat_plan, chat, held.model, st.options(held.model))
        return await st.answer(held, plan, request, ResponsesAnswer(body, st.chains, chain, lead))
