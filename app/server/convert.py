"""OpenAI request bodies → a ``Plan``: the engine requests to run, one per choice, and how to answer.

Decisions held here (each documented in docs/server.md):

The reasoning: docs/server.md, 'app/server/convert.py'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Optional

from app.assistant.turn import Caller
from app.engine.chat.tools import check_tool_grammars, parse_tool_choice, parse_tools
from app.errors import InvalidRequest
from app.protocol.tools import ToolCall, ToolChoice
from app.protocol.types import ChatMessage, DecodingParams, GenerateRequest
from app.server import reasoning
from app.server.openai_schema import ChatCompletionRequest, CompletionRequest, _Sampling
from app.server.reasoning import PortOptions
from app.server.structured import checked_format, grammar_for

MAX_GENERATIONS = 16  # prompts × n in one /v1/completions request
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "typical_p", "repeat_penalty", "presence_penalty",
                    "frequency_penalty")


@dataclass(frozen=True)
class Plan:
    """What one HTTP request runs. ``requests``: one engine request per choice, in index order;
    ``prompt_index``: which prompt each choice answers (usage counts each prompt once); ``logprobs``: None,
    or how many alternatives to report per token (0: only the chosen token's logprob); ``grounding``: the
    evidence given to the model (``app.server.documents.Grounding``), None unless ``hearth.documents``;
    ``consistency``: the ``hearth.self_consistency`` spec (``app.engine.policies.consistency.SelfConsistencySpec``):
    each request is then sampled ``consistency.n`` times and the vote's choice answers it; ``answer_format``:
    the ``response_format`` each whole answer is checked against after generation (``structured.check_answer``;
    None: nothing the grammar leaves out to check, or the format waits for a forced call); ``mcp_format``: with
    ``hearth.mcp_tools``, the format's grammar, which decodes the steps after a forced call (``mcp_tools``)."""

    kind: str  # "chat" | "text"
    model: str
    requests: tuple[GenerateRequest, ...]
    prompt_index: tuple[int, ...]
    stream: bool
    include_usage: bool
    logprobs: Optional[int] = None
    grounding: Any = None
    consistency: Any = None
    mcp_tools: bool = False  # hearth.mcp_tools: the port's MCP tools are offered and run (Service, mcp_tools)
    mcp_choice: Any = None  # with mcp_tools and no tools of the client's: its tool_choice, checked by mcp_tools
    answer_format: Any = None
    mcp_format: Optional[str] = None  # with mcp_tools: the response_format grammar, for the steps not forced


def chat_plan(body: ChatCompletionRequest, model: str, options: Optional[PortOptions] = None) -> Plan:
    """The ``Plan`` of a /v1/chat/completions body; raises ``InvalidRequest`` naming the field."""
    options = options or PortOptions()
    for legacy in ("functions", "function_call"):
        if getattr(body, legacy) is not None:
            raise InvalidRequest(f"{legacy} is the deprecated form of function calling; send tools and "
                                 "tool_choice", param=legacy)
    messages = _messages(body.messages)
    max_tokens = _max_tokens(body, body.max_completion_tokens, "max_completion_tokens")
    lp = _chat_logprobs(body)
    tools = parse_tools(body.tools)
    mcp = bool(body.hearth is not None and body.hearth.mcp_tools)
    mcp_choice = body.tool_choice if mcp and not tools else None  # checked against the MCP tools (mcp_tools)
    fmt_grammar = grammar_for(body.response_format)
    choice, grammar = tools_with_format(messages, parse_tool_choice(None if mcp_choice else body.tool_choice, tools),
                                        fmt_grammar)
    dec = _decoding(body, max_tokens, grammar)
    check_tool_grammars(tools, ToolChoice("required") if grammar and choice.mode == "auto" and tools else choice)
    parallel = body.parallel_tool_calls if body.parallel_tool_calls is not None else True
    base = _request(body, options, messages=messages, decoding=dec, want_logprobs=_want(lp), tools=tools,
                    tool_choice=choice, parallel_tool_calls=parallel).validate()
    sc = reasoning.self_consistency(body, options, base, logprobs=lp is not None, tools=bool(tools))
    return Plan("chat", model, _choices(base, body.n), (0,) * body.n, body.stream, _include_usage(body), lp,
                consistency=sc, mcp_tools=mcp, mcp_choice=mcp_choice, mcp_format=fmt_grammar if mcp else None,
                answer_format=checked_format(body.response_format) if grammar or (mcp and fmt_grammar) else None)


def completion_plan(body: CompletionRequest, model: str, options: Optional[PortOptions] = None) -> Plan:
    """The ``Plan`` of a /v1/completions body; raises ``InvalidRequest`` naming the field."""
    options = options or PortOptions()
    prompts = _prompts(body.prompt)
    if body.echo:
        raise InvalidRequest("echo is not supported", param="echo")
    if body.suffix:
        raise InvalidRequest("suffix (insertion) is not supported", param="suffix")
    if body.hearth is not None and body.hearth.documents:
        raise InvalidRequest("hearth.documents is only supported on /v1/chat/completions", param="hearth.documents")
    if body.best_of is not None and body.best_of != body.n:
        raise InvalidRequest("best_of is not supported (omit it or set it equal to n)", param="best_of")
    if len(prompts) * body.n > MAX_GENERATIONS:
        raise InvalidRequest(f"at most {MAX_GENERATIONS} completions per request (prompts × n), got "
                             f"{len(prompts) * body.n}", param="n")
    max_tokens = _max_tokens(body, None, None)
    dec = _decoding(body, max_tokens, grammar_for(body.response_format))
    lp = body.logprobs
    reqs: list[GenerateRequest] = []
    index: list[int] = []
    for i, text in enumerate(prompts):
        reqs.extend(_choices(_request(body, options, prompt=text, decoding=dec, want_logprobs=_want(lp)), body.n))
        index.extend([i] * body.n)
    sc = reasoning.self_consistency(body, options, reqs[0], prompts=len(prompts), logprobs=lp is not None)
    return Plan("text", model, tuple(reqs), tuple(index), body.stream, _include_usage(body), lp, consistency=sc,
                answer_format=checked_format(body.response_format))


def tools_with_format(messages: tuple[ChatMessage, ...], choice: ToolChoice,
                      grammar: Optional[str]) -> tuple[ToolChoice, Optional[str]]:
    """``(tool_choice, decoding grammar)`` of a turn with tools and a ``response_format`` grammar (docs/server.md,
    'Tools with structured output'): a forced ``choice`` forces its call and the format waits for the turn
    after the tool results (messages ending with a ``tool`` message), which answers in the format and calls
    nothing ("none"); under "auto" the grammar is kept and the engine joins it to the tools' calls
    (``ToolFormat.grammar``'s ``answer``: a call *or* an answer in the format); "none" answers in the format."""
    if grammar is None or not choice.forces_call:
        return choice, grammar
    if messages and messages[-1].role == "tool":
        return ToolChoice("none"), grammar
    return choice, None


# -- pieces ------------------------------------------------------------------------------------------------
def _request(body: _Sampling, options: PortOptions, **kw: Any) -> GenerateRequest:
    """The port's ``GenerateRequest``: ``Caller.PORT``'s priority, the ``hearth.deadline_s`` asked for
    (seconds; None: none; its range was checked by the schema), the thinking budget and the speculative mode
    (``app.server.reasoning``)."""
    deadline = body.hearth.deadline_s if body.hearth is not None else None
    req = GenerateRequest(**kw, deadline_s=deadline, reasoning=reasoning.reasoning_request(body, options),
                          speculative=reasoning.speculative(body))
    return Caller.PORT.stamp(req).validate()


def _messages(raw: list[Any]) -> tuple[ChatMessage, ...]:
    if not raw:
        raise InvalidRequest("messages must contain at least one message", param="messages")
    return tuple(_message(m, i) for i, m in enumerate(raw))


def _message(m: Any, i: int) -> ChatMessage:
    role = _ROLES.get(m.role)
    if role is None:
        raise InvalidRequest(f"messages[{i}].role {m.role!r} is not supported (system, developer, user, "
                             "assistant, tool)", param=f"messages[{i}].role")
    if m.tool_calls and role != "assistant":
        raise InvalidRequest(f"messages[{i}].tool_calls: only assistant messages carry tool calls",
                             param=f"messages[{i}].tool_calls")
    if role == "assistant" and m.tool_calls:
        calls = tuple(_tool_call(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m.tool_calls))
        content = "" if m.content is None else _content(m.content, i)
        return ChatMessage("assistant", content, calls)
    if role == "tool":
        return ChatMessage("tool", _content(m.content, i), tool_call_id=m.tool_call_id, name=m.name)
    return ChatMessage(role, _content(m.content, i))


def _tool_call(raw: Any, at: str) -> ToolCall:
    """One item of an assistant message's ``tool_calls``: ``{id, type: "function", function: {name,
    arguments}}``; ``arguments`` is JSON text (an object is accepted and serialised)."""
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict) or raw.get("type", "function") != "function":
        raise InvalidRequest(f'{at} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}',
                             param=at)
    call_id, name, args = raw.get("id"), fn.get("name"), fn.get("arguments", "{}")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequest(f"{at}.id must be a non-empty string", param=f"{at}.id")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{at}.function.name must be a non-empty string", param=f"{at}.function.name")
    if isinstance(args, dict):
        args = json.dumps(args, ensure_ascii=False)
    if not isinstance(args, str) or not _json_object(args):
        raise InvalidRequest(f"{at}.function.arguments must be a JSON object, as a string (got {args!r:.80})",
                             param=f"{at}.function.arguments")
    return ToolCall(call_id, name, args)


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _content(content: Any, i: int) -> str:
    param = f"messages[{i}].content"
    if content is None:
        raise InvalidRequest(f"{param} is required", param=param)
    return join_text(content, param, ("text",), "text content parts")


def join_text(content: Any, at: str, kinds: tuple[str, ...], what: str) -> str:
    """``content`` as one string: a string as given, or a list of text parts (objects whose ``type`` is one of
    ``kinds``, each with a string ``text``) joined with a newline; what every API's message content reads
    (chat ``content`` parts, Anthropic text blocks, Responses ``input_text``/``output_text``). ``at``: the
    parameter's name in errors; ``what``: the parts' name ("text blocks"). Raises ``InvalidRequest`` naming
    the part: not a list, another type of part, or a text part without a string ``text`` (``at[j].text``)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{at} must be a string or a list of {what}", param=at)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if not isinstance(part, dict) or kind not in kinds:
            raise InvalidRequest(f"{at}[{j}]: only {what} are supported ({', '.join(kinds)}), got {kind!r}",
                                 param=f"{at}[{j}]")
        if not isinstance(part.get("text"), str):
            raise InvalidRequest(f"{at}[{j}].text: a text part needs a string 'text', got "
                                 f"{type(part.get('text')).__name__ if 'text' in part else 'none'}",
                                 param=f"{at}[{j}].text")
        texts.append(part["text"])
    return "\n".join(texts)


def _prompts(prompt: Any) -> list[str]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise InvalidRequest("prompt must not be empty", param="prompt")
    if not all(isinstance(p, str) for p in prompt):
        raise InvalidRequest("token-id prompts are not supported; send text", param="prompt")
    return list(prompt)


def _max_tokens(body: _Sampling, alias: Optional[int], alias_name: Optional[str]) -> Optional[int]:
    for name, value in (("max_tokens", body.max_tokens), (alias_name, alias)):
        if name and value is not None and value < 1:
            raise InvalidRequest(f"{name} must be at least 1, got {value}", param=name)
    return alias if alias is not None else body.max_tokens


def _decoding(body: _Sampling, max_tokens: Optional[int], grammar: Optional[str]) -> DecodingParams:
    kw: dict[str, Any] = {k: getattr(body, k) for k in _SAMPLING_FIELDS if getattr(body, k) is not None}
    return DecodingParams.make(**kw, max_tokens=max_tokens, stop=body.stop, seed=body.seed,
                               logit_bias=body.logit_bias, grammar=grammar)


def _choices(base: GenerateRequest, n: int) -> list[GenerateRequest]:
    d = base.decoding
    if n == 1 or d.seed is None:
        return [base] * n
    return [replace(base, decoding=replace(d, seed=(d.seed + i) % 2**32)) for i in range(n)]


def _chat_logprobs(body: ChatCompletionRequest) -> Optional[int]:
    if body.logprobs:
        return body.top_logprobs or 0
    if body.top_logprobs:
        raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    return None


def _want(lp: Optional[int]) -> int:
    # The engine reports the chosen token's logprob only when it computes alternatives: ask for at least 1.
    return 0 if lp is None else max(1, lp)


def _include_usage(body: _Sampling) -> bool:
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest("stream_options is only allowed when stream is true", param="stream_options")
    return bool(body.stream and body.stream_options and body.stream_options.include_usage)


