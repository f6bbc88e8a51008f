"""How each model family was trained to see tools and write calls: prompt text, history, grammar, parser.

A model calls tools reliably only in the format it was trained on, so each family (``FORMATS``;
``format_for`` picks one) has its own tool block, history rendering, grammar and call parser.

The reasoning: docs/tools.md, 'app/engine/chat/tool_formats.py'.
"""

from __future__ import annotations

import json
import re
from typing import Callable, Sequence

from app.engine.chat.tool_parser import WS, Chars, ParsedOutput, ToolCallParser
from app.engine.chat.tools import forced_tools, parameters_gbnf
from app.engine.structured.schema_check import gbnf_code
from app.errors import InvalidRequest
from app.protocol.tools import ToolCall, ToolChoice, ToolSpec, new_call_id

_RULE_LINE = re.compile(r"([a-zA-Z0-9-]+)\s*::=(.*)")
_WORD = re.compile(r"[a-zA-Z0-9-]+")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


# -- grammar text -------------------------------------------------------------------------------------------
def gbnf_literal(s: str) -> str:
    """``s`` as a GBNF string literal (llama.cpp grammar syntax)."""
    return '"' + (s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
                  .replace("\t", "\\t")) + '"'


# llama-cpp-python 0.3.36's converter lets a JSON string hold raw control characters (``char ::= [^"\\]``);
# JSON forbids them, so a client's parser (and ours) would refuse such arguments, and a raw newline could even
# meet a stop string. llama.cpp's C++ converter excludes them; so do tool grammars.
_LOOSE_CHAR = r'[^"\\]'
_JSON_CHAR = r'[^"\\\x7F\x00-\x1F]'


def prefixed_rules(gbnf: str, prefix: str) -> list[str]:
    """The rules of ``gbnf`` (as written by the schema converter: one ``name ::= body`` per line) with every
    rule name, defined or referenced, prefixed by ``prefix``. String literals, character classes and
    ``{m,n}`` repetitions are left alone, except that a string character may not be a control character."""
    rules = _rules(gbnf.replace(_LOOSE_CHAR, _JSON_CHAR))
    names = {name for name, _ in rules}
    return [f"{prefix}{name} ::= {_rename(body, names, prefix)}" for name, body in rules]


def _rules(gbnf: str) -> list[tuple[str, str]]:
    """``(name, body)`` of each rule of ``gbnf``: one ``name ::= body`` per line as the converter writes
    them, or a rule over several lines with ``#`` comments (llama-cpp-python's ``JSON_GBNF``, the
    ``json_object`` grammar). Raises ``ValueError`` for text before the first rule."""
    rules: list[list[str]] = []
    for raw in gbnf.splitlines():
        line = _uncommented(raw).strip()
        if not line:
            continue
        m = _RULE_LINE.fullmatch(line)
        if m is not None:
            rules.append([m.group(1), m.group(2).strip()])
        elif rules:
            rules[-1][1] = f"{rules[-1][1]} {line}".strip()
        else:
            raise ValueError(f"unexpected line in converted grammar: {raw!r}")
    return [(name, body) for name, body in rules]


def _uncommented(line: str) -> str:
    """``line`` up to a ``#`` comment (one outside string literals and character classes)."""
    return next((line[:i] for i, c in gbnf_code(line) if c == "#"), line)


def _rename(body: str, names: set[str], prefix: str) -> str:
    out, i, n = [], 0, len(body)
    while i < n:
        c = body[i]
        if c in '"[{':
            close = {'"': '"', "[": "]", "{": "}"}[c]
            j = i + 1
            while j < n and body[j] != close:
                j += 2 if body[j] == "\\" else 1
            out.append(body[i:j + 1])
            i = j + 1
        elif (m := _WORD.match(body, i)) is not None:
            word = m.group(0)
            out.append(prefix + word if word in names else word)
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _answer_rules(answer: str) -> str:
    """``root ::= calls | a-root`` and ``answer``'s rules renamed ``a-…`` (tool rules are ``t<i>-…``,
    ``call…`` and ``calls``: no name is shared)."""
    try:
        rules = prefixed_rules(answer, "a-")
    except ValueError as exc:
        raise InvalidRequest(f"cannot combine the response_format grammar with the tools: {exc}",
                             param="response_format") from None
    return "root ::= calls | a-root\n" + "\n".join(rules) + "\n"


def _canonical(arguments: str) -> str:
    """Arguments as a template's ``tojson`` writes them (", " and ": "); the raw text if it is not JSON."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        return arguments


def _tool_json(tool: ToolSpec, indent: int | None = None) -> str:
    return json.dumps(tool.to_openai(), ensure_ascii=False, indent=indent)


# -- the formats ---------------------------------------------------------------------------------------------
class ToolFormat:
    """One family's way with tools. ``name``: its key in ``FORMATS``; ``tools_placement``: where the
    family was trained to see ``system_text`` ("system": in the system prompt, as ``system_prompt`` joins it;
    "before_last_user": Mistral's block goes right before the last ``[INST]``; ``system_prompt`` still works
    as a fallback); ``result_role``: the role of ``render_result``'s turn ("user", "ipython", or "tool":
    text placed as-is after the assistant turn, with no turn wrapper); ``stop``: stop strings to add while
    tools are offered (a model that goes on to invent the tool's result)."""

    name = ""
    tools_placement = "system"
    result_role = "user"
    stop: tuple[str, ...] = ()
    parser_class: type[ToolCallParser] = ToolCallParser

    def system_text(self, tools: Sequence[ToolSpec]) -> str:
        """The block that describes ``tools`` to the model, as the family was trained to read it."""
        raise NotImplementedError

    def system_prompt(self, tools: Sequence[ToolSpec], system: str = "") -> str:
        """The request's system prompt with ``system_text`` joined where the family expects it."""
        return "\n\n".join(p for p in (system.strip(), self.system_text(tools)) if p)

    def render_calls(self, calls: Sequence[ToolCall], content: str = "") -> str:
        """An assistant turn that made ``calls`` (after optional ``content``), as text for the history."""
        raise NotImplementedError

    def render_result(self, call: ToolCall, content: str) -> tuple[str, str]:
        """``(role, text)`` of the turn that shows ``call``'s result ``content`` to the model. Consecutive
        results of one family's "user" turns belong in one turn, joined by a newline."""
        raise NotImplementedError

    def grammar(self, tools: Sequence[ToolSpec], choice: ToolChoice, parallel: bool,
                answer: str | None = None) -> str | None:
        """GBNF (llama.cpp syntax, start rule ``root``) that allows only this family's call text: one call
        (``parallel`` False) or one or more, of any tool ("required") or of the named one. None when
        ``choice`` does not force a call ("auto", "none"), except "auto" with ``answer``: then the grammar
        allows a call of any tool *or* a text of ``answer`` (GBNF whose start rule is ``root``, as the schema
        converter writes it: the ``response_format`` grammar), one alternation at the root. Raises
        ``InvalidRequest(param="tool_choice")`` when ``choice`` asks for a tool that is not in ``tools``, and
        ``InvalidRequest(param="response_format")`` for an ``answer`` this reader cannot take apart."""
        if choice.mode == "auto" and answer and tools:
            return self._call_rules(list(tools), parallel, "calls") + _answer_rules(answer)
        if not choice.forces_call:
            return None
        return self._call_rules(forced_tools(tools, choice), parallel, "root")

    def _call_rules(self, chosen: list[ToolSpec], parallel: bool, start: str) -> str:
        """The rules of calls of ``chosen``, starting at rule ``start``."""
        # Tool i's schema rules are all named t<i>-…; the rules written here never start that way.
        lines = [f"{start} ::= {self._root_rule(parallel)}",
                 "call ::= " + " | ".join(f"call-{i}" for i in range(len(chosen)))]
        for i, tool in enumerate(chosen):
            lines.append(f"call-{i} ::= {self._call_rule(tool.name, f't{i}-root')}")
            try:
                lines += prefixed_rules(parameters_gbnf(tool.parameters), f"t{i}-")
            except ValueError as exc:  # the converter wrote a rule this reader does not know: refuse, not crash
                raise InvalidRequest(f"cannot build a grammar for tool {tool.name!r}: {exc}",
                                     param="tools") from None
        return "\n".join(lines) + "\n"

    def _root_rule(self, parallel: bool) -> str:
        return 'call ("\\n" call)*' if parallel else "call"

    def _call_rule(self, name: str, args_rule: str) -> str:
        raise NotImplementedError

    def parser(self, new_id: Callable[[], str] = new_call_id) -> ToolCallParser:
        """A fresh streaming parser of this family's answers (``new_id`` makes call ids)."""
        return self.parser_class(new_id)

    def parse(self, text: str, new_id: Callable[[], str] = new_call_id) -> ParsedOutput:
        """A whole answer parsed at once (the same parser, fed everything)."""
        p = self.parser(new_id)
        p.feed(text)
        p.finish()
        return p.result()

    def __repr__(self) -> str:
        return f"<ToolFormat {self.name}>"


class HermesParser(ToolCallParser):
    markers = ("<tool_call>",)
    closer = "</tool_call>"

    def _region(self, marker: str) -> Chars:
        c = yield from self._skip_ws()
        if c != "{":
            raise self._bad("expected a JSON object after <tool_call>", c)
        yield from self._object()
        yield from self._optional_closer()

    def _optional_closer(self) -> Chars:
        """Consume ``</tool_call>`` after a call if it is there (a model stopped by ``<|im_end|>`` may omit
        it); anything else goes back to be read as text."""
        got = ""
        while True:
            c = yield from self._getc()
            if c is None:
                break
            got += c
            rest = got.lstrip(WS)
            if rest == self.closer:
                self._raw = []
                return
            if not self.closer.startswith(rest):
                break
        self._unget(got)


class HermesFormat(ToolFormat):
    name = "hermes"
    stop = ("<tool_response>",)
    parser_class = HermesParser

    def system_text(self, tools: Sequence[ToolSpec]) -> str:
        return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
                + "".join("\n" + _tool_json(t) for t in tools)
                + "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')

    def render_calls(self, calls: Sequence[ToolCall], content: str = "") -> str:
        parts = [content] if content else []
        parts += [f'<tool_call>\n{{"name": {json.dumps(c.name)}, "arguments": {_canonical(c.arguments)}}}\n'
                  "</tool_call>" for c in calls]
        return "\n".join(parts)

    def render_result(self, call: ToolCall, content: str) -> tuple[str, str]:
        return "user", f"<tool_response>\n{content}\n</tool_response>"

    def _call_rule(self, name: str, args_rule: str) -> str:
        return (gbnf_literal(f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": ') + f" {args_rule} "
                + gbnf_literal("}\n</tool_call>"))


class Llama3Parser(ToolCallParser):
    markers = ("<|python_tag|>",)
    bare_json = True
    separators = WS + ";"

    def _region(self, marker: str) -> Chars:
        if marker == "{":
            yield from self._object(tentative=True)
            return
        c = yield from self._skip_ws()
        if c != "{":
            raise self._bad("expected a JSON object after <|python_tag|>", c)
        yield from self._object()


class Llama3Format(ToolFormat):
    name = "llama3"
    result_role = "ipython"
    parser_class = Llama3Parser

    def system_text(self, tools: Sequence[ToolSpec]) -> str:
        return ("Environment: ipython\n\nYou have access to the following functions. To call a function, please "
                "respond with JSON for a function call. Respond in the format "
                '{"name": function name, "parameters": dictionary of argument name and its value}. '
                "Do not use variables.\n\n" + "\n\n".join(_tool_json(t, indent=4) for t in tools))

    def system_prompt(self, tools: Sequence[ToolSpec], system: str = "") -> str:
        # The template writes the tools before the request's own system message.
        return "\n\n".join(p for p in (self.system_text(tools), system.strip()) if p)

    def render_calls(self, calls: Sequence[ToolCall], content: str = "") -> str:
        parts = [content] if content else []
        parts += [f'{{"name": {json.dumps(c.name)}, "parameters": {_canonical(c.arguments)}}}' for c in calls]
        return "\n".join(parts)

    def render_result(self, call: ToolCall, content: str) -> tuple[str, str]:
        return "ipython", content

    def _call_rule(self, name: str, args_rule: str) -> str:
        return (gbnf_literal(f'{{"name": {json.dumps(name)}, "parameters": ') + f" {args_rule} "
                + gbnf_literal("}"))


class MistralParser(ToolCallParser):
    markers = ("[TOOL_CALLS]",)

    def _region(self, marker: str) -> Chars:
        c = yield from self._skip_ws()
        if c == "[":
            yield from self._call_list()
        elif c == "{":
            yield from self._object()
        elif c in _NAME_CHARS:
            yield from self._tagged_call(c)
        else:
            raise self._bad("expected a list of calls or a name after [TOOL_CALLS]", c)

    def _call_list(self) -> Chars:
        c = yield from self._skip_ws()
        if c == "]":
            return
        while True:
            if c != "{":
                raise self._bad("expected a call object in the [TOOL_CALLS] list", c)
            yield from self._object()
            c = yield from self._skip_ws(need=False)
            if c is None or c == "]":  # a list cut off after a whole call still gave that call
                return
            if c != ",":
                raise self._bad("expected ',' or ']' in the [TOOL_CALLS] list", c)
            c = yield from self._skip_ws()

    def _tagged_call(self, c: str) -> Chars:
        """``name[ARGS]{...}`` or ``name[CALL_ID]id[ARGS]{...}`` (Mistral tokenizer v11+)."""
        name = yield from self._word(c)
        tag = yield from self._tag()
        if tag == "CALL_ID":
            first = yield from self._need()
            yield from self._word(first)
            tag = yield from self._tag()
        if tag != "ARGS":
            raise self._bad(f"expected [ARGS] after the tool's name, got [{tag}]", None)
        self._start_call(name)
        c = yield from self._skip_ws()
        args = yield from self._arguments(c)
        self._end_call(args)

    def _word(self, c: str) -> Chars:
        word = ""
        while c != "[":
            if c not in _NAME_CHARS:
                raise self._bad(f"unexpected {c!r} in a tool name after [TOOL_CALLS]", c)
            word += c
            c = yield from self._need()
        return word

    def _tag(self) -> Chars:
        """A control tag after its ``[``: returns ``ARGS`` for ``[ARGS]``."""
        tag = ""
        while (c := (yield from self._need())) != "]":
            tag += c
            if len(tag) > 16:
                raise self._bad("unterminated [tag] in the tool call", None)
        return tag


def _id9(call_id: str) -> str:
    """A call id as Mistral's templates demand: 9 ASCII letters/digits (the last 9 of ours)."""
    alnum = "".join(c for c in call_id if c.isascii() and c.isalnum())
    return alnum[-9:].rjust(9, "0")


class MistralFormat(ToolFormat):
    name = "mistral"
    tools_placement = "before_last_user"
    result_role = "tool"
    stop = ("[TOOL_RESULTS]",)
    parser_class = MistralParser

    def system_text(self, tools: Sequence[ToolSpec]) -> str:
        return "[AVAILABLE_TOOLS] [" + ", ".join(_tool_json(t) for t in tools) + "][/AVAILABLE_TOOLS]"

    def render_calls(self, calls: Sequence[ToolCall], content: str = "") -> str:
        items = [f'{{"name": {json.dumps(c.name)}, "arguments": {_canonical(c.arguments)}, '
                 f'"id": "{_id9(c.id)}"}}' for c in calls]
        return content + "[TOOL_CALLS] [" + ", ".join(items) + "]"

    def render_result(self, call: ToolCall, content: str) -> tuple[str, str]:
        try:
            json.loads(content)
            body = content
        except ValueError:  # the template pastes content in raw; plain text must become a JSON string
            body = json.dumps(content, ensure_ascii=False)
        return "tool", f'[TOOL_RESULTS] {{"content": {body}, "call_id": "{_id9(call.id)}"}}[/TOOL_RESULTS]'

    def _root_rule(self, parallel: bool) -> str:
        return '"[TOOL_CALLS] [" call ' + ('(", " call)* ' if parallel else "") + '"]"'

    def _call_rule(self, name: str, args_rule: str) -> str:
        return (gbnf_literal(f'{{"name": {json.dumps(name)}, "arguments": ') + f" {args_rule} "
                + gbnf_literal(', "id": "') + " [a-zA-Z0-9]{9} " + gbnf_literal('"}'))


class MistralV11Format(MistralFormat):
    name = "mistral-v11"

    def system_text(self, tools: Sequence[ToolSpec]) -> str:
        return "[AVAILABLE_TOOLS][" + ", ".join(_tool_json(t) for t in tools) + "][/AVAILABLE_TOOLS]"

    def render_calls(self, calls: Sequence[ToolCall], content: str = "") -> str:
        return content + "".join(f"[TOOL_CALLS]{c.name}[ARGS]{_canonical(c.arguments)}" for c in calls)

    def render_result(self, call: ToolCall, content: str) -> tuple[str, str]:
        return "tool", f"[TOOL_RESULTS]{content}[/TOOL_RESULTS]"

    def _root_rule(self, parallel: bool) -> str:
        return "call+" if parallel else "call"

    def _call_rule(self, name: str, args_rule: str) -> str:
        return gbnf_literal(f"[TOOL_CALLS]{name}[ARGS]") + f" {args_rule}"


class JsonParser(ToolCallParser):
    markers = ("Tool call:",)
    resync_at_newline = True

    def _region(self, marker: str) -> Chars:
        c = yield from self._skip_ws()
        if c != "{":
            raise self._bad('expected a JSON object after "Tool call:"', c)
        yield from self._object()


JSON_EXAMPLE = (
    "Example (get_time is only an example tool):\n"
    "User: What time is it in Tokyo?\n"
    'Assistant: Tool call: {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}\n\n'
    'User: Tool result: {"time": "14:05"}\n'
    "Assistant: It is 14:05 in Tokyo.\n\n"
)


class JsonFormat(ToolFormat):
    name = "json"
    stop = ("Tool result:",)
    parser_class = JsonParser

    def system_text(self, tools: Sequence[ToolSpec]) -> str:
        lines = [json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters},
                            ensure_ascii=False) for t in tools]
        return ("The following is a conversation between a User and a helpful, concise Assistant. The Assistant "
                'can call tools. To call a tool, the Assistant answers with one line, "Tool call:" and a JSON '
                'object with the tool\'s "name" and its "arguments"; the result comes back in the next turn, '
                'after "Tool result:".\n\n' + JSON_EXAMPLE + "The Assistant's tools:\n" + "\n".join(lines))

    def system_prompt(self, tools: Sequence[ToolSpec], system: str = "") -> str:
        # The block opens the document (it replaces the transcript's preamble); the request's system follows.
        return "\n\n".join(p for p in (self.system_text(tools), system.strip()) if p)

    def render_calls(self, calls: Sequence[ToolCall], content: str = "") -> str:
        parts = [content] if content else []
        parts += [f'Tool call: {{"name": {json.dumps(c.name)}, "arguments": {_canonical(c.arguments)}}}'
                  for c in calls]
        return "\n".join(parts)

    def render_result(self, call: ToolCall, content: str) -> tuple[str, str]:
        return "user", f"Tool result: {content}"

    def _root_rule(self, parallel: bool) -> str:
        # The blank line is the transcript's stop string: where a base model ends its turn (docs/tools.md,
        # 'app/engine/chat/tool_formats.py').
        return '" "? call' + (' ("\\n" call)*' if parallel else "") + ' "\\n\\n"?'

    def _call_rule(self, name: str, args_rule: str) -> str:
        return (gbnf_literal(f'Tool call: {{"name": {json.dumps(name)}, "arguments": ') + f" {args_rule} "
                + gbnf_literal("}"))


FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HermesFormat(), Llama3Format(), MistralFormat(),
                                                       MistralV11Format(), JsonFormat())}
_BY_TEMPLATE = {"chatml": "hermes", "llama-3": "llama3", "mistral": "mistral", "gemma": "json",
                "transcript": "json"}


def format_for(template_name: str, architecture: str, chat_template: str | None) -> ToolFormat:
    """The tool format for a model, first match wins: the GGUF's chat template names the family
    (``<tool_call>`` → hermes, ``[TOOL_CALLS]`` → mistral, or mistral-v11 with ``[ARGS]``, ``<|python_tag|>`` or
    ``ipython`` → llama3); then Hearth's template name (transcript and gemma → json, chatml → hermes,
    llama-3 → llama3, mistral → mistral); then the architecture (gemma → json, qwen → hermes) or the template's
    turn markers (``<|im_start|>`` → hermes, ``<|start_header_id|>`` → llama3); json otherwise."""
    t = chat_template or ""
    if "<tool_call>" in t:
        return FORMATS["hermes"]
    if "[TOOL_CALLS]" in t:
        return FORMATS["mistral-v11" if "[ARGS]" in t else "mistral"]
    if "<|python_tag|>" in t or "ipython" in t:
        return FORMATS["llama3"]
    if template_name in _BY_TEMPLATE:
        return FORMATS[_BY_TEMPLATE[template_name]]
    arch = (architecture or "").lower()
    if arch.startswith("gemma"):
        return FORMATS["json"]
    if arch.startswith("qwen") or "<|im_start|>" in t:
        return FORMATS["hermes"]
    if "<|start_header_id|>" in t:
        return FORMATS["llama3"]
    return FORMATS["json"]

