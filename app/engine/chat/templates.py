"""Chat templates: turn a list of chat messages into the exact prompt text a model was trained on.

``choose_template_name`` picks the GGUF's own Jinja template, a plain transcript for a base model, or a
built-in template by architecture; a request's tools, calls and results reach the model as its family was
trained to see them.

The reasoning: docs/engine.md, 'app/engine/chat/templates.py'.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Mapping, Sequence

from app.engine.chat.tool_formats import ToolFormat, format_for
from app.errors import InvalidRequest
from app.protocol.tools import ToolCall, ToolChoice, ToolSpec
from app.protocol.types import ChatMessage

TEMPLATE_NAMES = ("gguf", "transcript", "gemma", "llama-3", "mistral", "chatml")

TRANSCRIPT_PREAMBLE = (
    "The following is a conversation between a User and a helpful, concise Assistant.\n\n"
    "User: What is the largest planet in the solar system?\n"
    "Assistant: Jupiter.\n\n"
)


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt ready to tokenize. ``text`` may hold control-token text (tokenize with special=True);
    ``add_bos``: prepend the model's BOS token; ``stop``: extra stop strings this template needs;
    ``name``: the template used (reported in each answer's metadata); ``grammar``: GBNF the answer must follow
    (a forced tool call), None when free; ``tool_format``: the ``ToolFormat`` name whose calls the answer is
    read for ("" when no tools were offered). ``stop`` is empty while a grammar binds the answer (``render``)."""

    text: str
    name: str
    add_bos: bool = True
    stop: tuple[str, ...] = ()
    grammar: str | None = None
    tool_format: str = ""


_INSTRUCT_HINT = re.compile(r"(^|[^a-z])(it|instruct|chat|sft|dpo|rlhf)([^a-z]|$)", re.I)


def choose_template_name(info: Any) -> str:
    """Pick a template name for a model. ``info`` has attributes ``chat_template`` (str or None),
    ``architecture`` (str), and optionally ``name``, ``finetune``, ``file_name``."""
    if getattr(info, "chat_template", None):
        return "gguf"
    hints = " ".join(str(getattr(info, a, "") or "") for a in ("name", "finetune", "file_name"))
    if not _INSTRUCT_HINT.search(hints):
        return "transcript"
    arch = (getattr(info, "architecture", "") or "").lower()
    name = hints.lower()
    if arch.startswith("gemma"):
        return "gemma"
    if arch == "llama" and ("llama-3" in name or "llama3" in name):
        return "llama-3"
    if arch == "llama" and "mistral" in name or arch == "mistral":
        return "mistral"
    return "chatml"


def _merge_system(messages: Sequence[Any]) -> list[tuple[str, str]]:
    """Fold system messages into the first user turn (for templates without a system role)."""
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    rest = [(m.role, m.content) for m in messages if m.role != "system"]
    if system:
        if rest and rest[0][0] == "user":
            rest[0] = ("user", f"{system}\n\n{rest[0][1]}")
        else:
            rest.insert(0, ("user", system))
    return rest


def _transcript(messages: Sequence[Any]) -> RenderedPrompt:
    system = "\n\n".join(m.content.strip() for m in messages if m.role == "system")
    parts = [TRANSCRIPT_PREAMBLE if not system else f"{system}\n\n"]
    for m in messages:
        if m.role == "user":
            parts.append(f"User: {m.content.strip()}\n")
        elif m.role == "assistant":
            parts.append(f"Assistant: {m.content.strip()}\n\n")
    parts.append("Assistant:")
    # A base model's answer ends at a blank line or where it starts writing the next turn (it would otherwise go
    # on inventing questions and answers).
    return RenderedPrompt("".join(parts), "transcript", True, ("\n\n", "\nUser:", "User:"))


def _gemma(messages: Sequence[Any]) -> RenderedPrompt:
    out = []
    for role, content in _merge_system(messages):
        r = "model" if role == "assistant" else "user"
        out.append(f"<start_of_turn>{r}\n{content}<end_of_turn>\n")
    out.append("<start_of_turn>model\n")
    return RenderedPrompt("".join(out), "gemma", True, ())


def _llama3(messages: Sequence[Any]) -> RenderedPrompt:
    out = []
    for m in messages:
        out.append(f"<|start_header_id|>{m.role}<|end_header_id|>\n\n{m.content.strip()}<|eot_id|>")
    out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return RenderedPrompt("".join(out), "llama-3", True, ())


def _mistral(messages: Sequence[Any]) -> RenderedPrompt:
    out = []
    for role, content in _merge_system(messages):
        if role == "user":
            out.append(f"[INST] {content.strip()} [/INST]")
        elif role in ("tool", "tools"):  # [TOOL_RESULTS] / [AVAILABLE_TOOLS] blocks, pasted as they are
            out.append(content)
        elif content.startswith("[TOOL_CALLS]"):
            out.append(f"{content.strip()}</s>")
        else:
            out.append(f" {content.strip()}</s>")
    return RenderedPrompt("".join(out), "mistral", True, ())


def _chatml(messages: Sequence[Any]) -> RenderedPrompt:
    out = [f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages]
    out.append("<|im_start|>assistant\n")
    return RenderedPrompt("".join(out), "chatml", False, ("<|im_end|>",))


def _tojson(value: Any, indent: int | None = None) -> str:
    # Hugging Face's ``tojson`` (transformers' chat-template environment): no HTML escaping, non-ASCII kept.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(msg: str) -> None:
    raise InvalidRequest(f"the model's chat template refused the messages: {msg}", param="messages")


@lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    return env.from_string(template)


def _gguf_text(messages: list[dict[str, Any]], template: str, bos_token: str, eos_token: str,
               tools: list[dict[str, Any]] | None = None, template_vars: Mapping[str, Any] | None = None) -> str:
    import jinja2

    try:
        return _compiled(template).render(**dict(template_vars or {}), messages=messages, tools=tools,
                                          bos_token=bos_token, eos_token=eos_token, add_generation_prompt=True,
                                          raise_exception=_raise)
    except InvalidRequest:
        raise
    except jinja2.TemplateError as exc:
        raise InvalidRequest(f"the model's chat template failed: {exc}", param="messages") from None


def _gguf(messages: Sequence[Any], template: str, bos_token: str, eos_token: str,
          template_vars: Mapping[str, Any] | None = None) -> RenderedPrompt:
    text = _gguf_text([{"role": m.role, "content": m.content} for m in messages], template, bos_token, eos_token,
                      None, template_vars)
    add_bos = not (bos_token and text.startswith(bos_token))
    return RenderedPrompt(text, "gguf", add_bos, ())


# -- tools ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolCaps:
    """What a GGUF template renders itself: the ``tools`` list, assistant ``tool_calls``, ``tool`` messages."""

    tools: bool = False
    calls: bool = False
    results: bool = False


_PROBE_TOOL = ToolSpec("hearth_probe_tool", "probe", {"type": "object", "properties": {"hearth_probe_arg": {
    "type": "string"}}})
_PROBE_CALL = ToolCall("123456789", "hearth_probe_call", '{"hearth_probe_arg": "x"}')


@lru_cache(maxsize=8)
def template_tool_caps(template: str, bos_token: str = "", eos_token: str = "") -> ToolCaps:
    """Which tool parts ``template`` renders: each probe (a tool, a call, a result with marked names) is
    rendered and looked for in the text; a template that fails on a probe does not render that part."""
    user = {"role": "user", "content": "hi"}
    asked = {"role": "assistant", "content": "", "tool_calls": [_jinja_call(_PROBE_CALL)]}
    result = {"role": "tool", "content": "hearth_probe_result", "tool_call_id": _PROBE_CALL.id,
              "name": _PROBE_CALL.name}

    def shows(needle: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> bool:
        try:
            return needle in _gguf_text(messages, template, bos_token, eos_token, tools)
        except Exception:  # noqa: BLE001 - a template that raises does not render this part
            return False

    return ToolCaps(shows(_PROBE_TOOL.name, [user], [_PROBE_TOOL.to_openai()]),
                    shows(_PROBE_CALL.name, [user, asked]),
                    shows("hearth_probe_result", [user, asked, result, user]))


def tool_format(name: str, architecture: str = "", chat_template: str | None = None) -> ToolFormat:
    """The ``ToolFormat`` for prompts rendered with template ``name``: the GGUF template's source names the
    family when ``name`` is "gguf"; a built-in template's own family otherwise (``format_for``)."""
    return format_for(name, architecture, chat_template if name == "gguf" else None)


def _jinja_call(call: ToolCall, mistral: bool = False) -> dict[str, Any]:
    try:
        args: Any = json.loads(call.arguments)
    except ValueError:
        args = call.arguments
    call_id = _mistral_id(call.id) if mistral else call.id
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": args}}


def _mistral_id(call_id: str) -> str:
    alnum = "".join(c for c in call_id if c.isascii() and c.isalnum())
    return alnum[-9:].rjust(9, "0")  # Mistral's templates refuse ids that are not 9 letters/digits


def _calls_by_id(messages: Sequence[ChatMessage]) -> dict[str, ToolCall]:
    return {c.id: c for m in messages for c in m.tool_calls}


def _result_call(m: ChatMessage, calls: dict[str, ToolCall]) -> ToolCall:
    return calls.get(m.tool_call_id or "") or ToolCall(m.tool_call_id or "", m.name or "", "{}")


def _format_turns(messages: Sequence[ChatMessage], fmt: ToolFormat, tools: Sequence[ToolSpec],
                  caps: ToolCaps = ToolCaps()) -> list[ChatMessage]:
    """``messages`` with the parts ``caps`` says the template does not render written as ``fmt``'s text:
    the tool block joined to the (one, leading) system message, calls as assistant text, results as turns
    of ``fmt.result_role`` ("tool" turns are pasted as-is by the template; consecutive "user" results are
    one turn)."""
    calls = _calls_by_id(messages)
    out: list[ChatMessage] = []
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    if tools and not caps.tools and fmt.tools_placement == "system":
        system = fmt.system_prompt(tools, system)
    if system:
        out.append(ChatMessage("system", system))
    merge = False
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "tool" and not caps.results:
            role, text = fmt.render_result(_result_call(m, calls), m.content)
            if merge and role == "user":
                out[-1] = replace(out[-1], content=out[-1].content + "\n" + text)
            else:
                out.append(ChatMessage(role, text))
            merge = role == "user"
            continue
        merge = False
        if m.role == "assistant" and m.tool_calls and not caps.calls:
            m = ChatMessage("assistant", fmt.render_calls(m.tool_calls, m.content))
        out.append(m)
    if tools and not caps.tools and fmt.tools_placement == "before_last_user":
        last = max((i for i, m in enumerate(out) if m.role == "user"), default=len(out))
        out.insert(last, ChatMessage("tools", fmt.system_text(tools)))
    return out


def _gguf_tools(messages: Sequence[ChatMessage], template: str, bos_token: str, eos_token: str,
                fmt: ToolFormat, tools: Sequence[ToolSpec],
                template_vars: Mapping[str, Any] | None = None) -> RenderedPrompt:
    caps = template_tool_caps(template, bos_token, eos_token)
    turns = _format_turns(messages, fmt, tools, caps)
    mistral = fmt.name.startswith("mistral")
    calls = _calls_by_id(messages)
    out: list[dict[str, Any]] = []
    for m in turns:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["tool_calls"] = [_jinja_call(c, mistral) for c in m.tool_calls]
        if m.role == "tool" and caps.results:
            d["tool_call_id"] = _mistral_id(m.tool_call_id or "") if mistral else m.tool_call_id
            d["name"] = m.name or _result_call(m, calls).name
        if m.role not in ("system", "user", "assistant", "tool"):  # a polyfilled result turn (ipython, tools)
            d["role"] = "user"
        out.append(d)
    spec = [t.to_openai() for t in tools] if tools and caps.tools else None
    text = _gguf_text(out, template, bos_token, eos_token, spec, template_vars)
    return RenderedPrompt(text, "gguf", not (bos_token and text.startswith(bos_token)), ())


def _uses_tools(messages: Sequence[Any], tools: Sequence[ToolSpec]) -> bool:
    return bool(tools) or any(getattr(m, "tool_calls", ()) or m.role == "tool" for m in messages)


def _with_tool_decoding(rp: RenderedPrompt, fmt: ToolFormat, tools: Sequence[ToolSpec],
                        choice: ToolChoice | None, parallel: bool, answer: str | None = None) -> RenderedPrompt:
    if not tools:
        return rp
    choice = choice or ToolChoice("auto")
    stop = rp.stop + tuple(s for s in fmt.stop if s not in rp.stop)
    return replace(rp, stop=stop, grammar=fmt.grammar(tools, choice, parallel, answer), tool_format=fmt.name)


def render(messages: Sequence[Any], name: str, *, chat_template: str | None = None, bos_token: str = "",
           eos_token: str = "", tools: Sequence[ToolSpec] = (), tool_choice: ToolChoice | None = None,
           parallel_tool_calls: bool = True, architecture: str = "",
           template_vars: Mapping[str, Any] | None = None, answer_grammar: str | None = None) -> RenderedPrompt:
    """Render ``messages`` (``ChatMessage``s, or objects with ``role`` and ``content``) with template ``name``.

    With ``tools``, or calls and results in the history, the model's ``ToolFormat`` (``tool_format(name,
    architecture, chat_template)``) or the GGUF template renders them (docs/engine.md,
    'app/engine/chat/templates.py'); ``tool_choice`` "required" / a named function sets ``grammar`` (one call,
    or several with ``parallel_tool_calls``).
    ``template_vars``: extra variables for the GGUF template (``reasoning_budget.render_kwargs``: Qwen3's
    ``enable_thinking``, GPT-OSS's ``reasoning_effort``); built-in templates have none.

    A final assistant message without tool calls is *continued*, not closed (prefill, as llama-server and
    Hugging Face's ``continue_final_message`` do): the messages before it are rendered with the generation
    prompt and its content follows as written, so a client can start the answer, or the thinking, itself.

    While a grammar binds the answer (``answer_grammar``, the ``response_format`` one, or the returned ``grammar``
    of a forced call or of calls-or-format) the template's and the tool format's stop strings are dropped: they
    would cut the JSON inside a string ("User: Bob", "Tool result:", a blank line) into invalid JSON; the grammar
    decides where the answer ends (it allows the end of generation, the end-of-turn token, only once complete). A
    request's own ``decoding.stop`` still applies (the engine adds it). Unbound answers keep them.

    Raises ``InvalidRequest`` for an unknown template name or a template that fails on these messages."""
    if len(messages) > 1 and messages[-1].role == "assistant" and not getattr(messages[-1], "tool_calls", ()):
        head = render(messages[:-1], name, chat_template=chat_template, bos_token=bos_token, eos_token=eos_token,
                      tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                      architecture=architecture, template_vars=template_vars, answer_grammar=answer_grammar)
        return replace(head, text=head.text + messages[-1].content)
    if name == "gguf" and not chat_template:
        raise InvalidRequest("template 'gguf' requested but the model has no chat template", param="template")
    fn = {"transcript": _transcript, "gemma": _gemma, "llama-3": _llama3, "mistral": _mistral,
          "chatml": _chatml}.get(name)
    if fn is None and name != "gguf":
        raise InvalidRequest(f"unknown template {name!r}; choose one of {', '.join(TEMPLATE_NAMES)}",
                             param="template")
    if not _uses_tools(messages, tools):
        if fn is not None:
            rp = fn(messages)
        else:
            assert chat_template is not None  # "gguf" without one was refused above
            rp = _gguf(messages, chat_template, bos_token, eos_token, template_vars)
    else:
        fmt = tool_format(name, architecture, chat_template)
        if fn is None:
            assert chat_template is not None
            rp = _gguf_tools(messages, chat_template, bos_token, eos_token, fmt, tools, template_vars)
        else:
            rp = fn(_format_turns(messages, fmt, tools))
        rp = _with_tool_decoding(rp, fmt, tools, tool_choice, parallel_tool_calls, answer_grammar)
    return replace(rp, stop=()) if rp.grammar or answer_grammar else rp

