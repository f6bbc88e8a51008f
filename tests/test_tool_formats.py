"""Function calling, pure logic: tool lists, tool_choice, the per-family formats, their grammars and the
streaming parser, on recorded-style model outputs (issue 13).

Every recorded output is also fed in two pieces split at every position and one character at a time: the
events must add up to the one-shot parse. The grammars are checked by llama.cpp itself (in a subprocess that
loads only the bundled model's vocabulary): each compiles, accepts the text ``render_calls`` writes for its
family, and refuses a wrong one.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from typing import Any

import pytest

from app.engine.chat.tool_formats import FORMATS, format_for, prefixed_rules
from app.engine.chat.tool_parser import ArgsPiece, CallEnd, CallFailed, CallStart, ParsedOutput, TextPiece
from app.engine.chat.tools import MAX_TOOLS, parse_tool_choice, parse_tools, validate_call
from app.errors import InvalidRequest
from app.protocol.tools import ToolCall, ToolChoice, new_call_id

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "web-search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["query"], "additionalProperties": False}, "strict": True}}
PING = {"type": "function", "function": {"name": "ping"}}
TOOLS = parse_tools([WEATHER, SEARCH, PING])


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def run(fmt_name: str, chunks: list[str]) -> tuple[list[Any], ParsedOutput]:
    p = FORMATS[fmt_name].parser(ids())
    events = []
    for chunk in chunks:
        events += p.feed(chunk)
    events += p.finish()
    return events, p.result()


def check_events(events: list[Any], result: ParsedOutput) -> None:
    """The events of one parse agree with its result."""
    assert "".join(e.text for e in events if isinstance(e, TextPiece)) == result.text
    started = {e.index: e for e in events if isinstance(e, CallStart)}
    ended = [e for e in events if isinstance(e, CallEnd)]
    assert [e.call for e in ended] == list(result.calls)
    assert [e.error for e in events if isinstance(e, CallFailed)] == list(result.errors)
    for end in ended:
        start = started[end.index]
        assert (start.id, start.name) == (end.call.id, end.call.name)
        pieces = [e for e in events if isinstance(e, ArgsPiece) and e.index == end.index]
        assert pieces and "".join(p.text for p in pieces) == end.call.arguments
        assert events.index(start) < events.index(pieces[0])
        assert events.index(pieces[-1]) < events.index(end)
    for e in events:
        if isinstance(e, ArgsPiece):
            assert e.index in started


def parse_everywhere(fmt_name: str, text: str) -> ParsedOutput:
    """Parse ``text`` whole, split in two at every position, and char by char; all must agree."""
    events, whole = run(fmt_name, [text])
    check_events(events, whole)
    splits = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for chunks in splits:
        events, result = run(fmt_name, chunks)
        check_events(events, result)
        assert result == whole, chunks
    return whole


def calls_of(result: ParsedOutput) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in result.calls]


# -- recorded-style outputs --------------------------------------------------------------------------------------
HERMES_CASES = [
    # Qwen2.5-7B-Instruct, one call, text before it
    ('I\'ll look that up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
     "\n</tool_call>", "I'll look that up.", [("get_weather", {"city": "Paris", "unit": "celsius"})], 0),
    # two calls, unicode and escaped quotes in the arguments
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "São Paulo \\"SP\\" 東京 \\u00e9 🌧"}}\n'
     "</tool_call>\n"
     '<tool_call>\n{"name": "web-search", "arguments": {"query": "a \\\\ b {not} [a] \\"q\\"", "limit": 3}}\n'
     "</tool_call>",
     "", [("get_weather", {"city": 'São Paulo "SP" 東京 é 🌧'}),
          ("web-search", {"query": 'a \\ b {not} [a] "q"', "limit": 3})], 0),
    # Hermes 2 Pro writes the arguments first; a no-argument call; text after the calls
    ('<tool_call>\n{"arguments": {"city": "Oslo"}, "name": "get_weather"}\n</tool_call>\n'
     '<tool_call>\n{"name": "ping"}\n</tool_call>\nDone.',
     "Done.", [("get_weather", {"city": "Oslo"}), ("ping", {})], 0),
    # arguments as a JSON string; no closing tag before the end (stopped on <|im_end|>)
    ('<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}',
     "", [("get_weather", {"city": "Rome"})], 0),
    # malformed: the object is not closed; the text after the closing tag survives
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>\nSorry.',
     "Sorry.", [], 1),
    # malformed arguments, then a good call
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>\n'
     '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>', "", [("ping", {})], 1),
    # cut off by max_tokens
    ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "Checking.", [], 1),
    # no call at all: the text comes through unchanged, even what looks like half a marker
    ("Use <tool> tags, a < b, and <tool_call without the bracket.\n\n", None, [], 0),
]

LLAMA3_CASES = [
    # Llama-3.1-8B-Instruct, JSON tool calling
    ('{"name": "get_weather", "parameters": {"city": "Berlin", "unit": "celsius"}}', "",
     [("get_weather", {"city": "Berlin", "unit": "celsius"})], 0),
    # the python_tag form, after some text; arguments key spelled "arguments"
    ('Let me check.<|python_tag|>{"name": "get_weather", "arguments": {"city": "Lyon"}}', "Let me check.",
     [("get_weather", {"city": "Lyon"})], 0),
    # "type": "function" first (Llama 3.2 1B/3B), two calls separated by "; "
    ('{"type": "function", "name": "get_weather", "parameters": {"city": "Nice"}}; '
     '{"name": "web-search", "parameters": {"query": "nice \\"weather\\" ☀"}}', "",
     [("get_weather", {"city": "Nice"}), ("web-search", {"query": 'nice "weather" ☀'})], 0),
    # a JSON answer that is not a call stays text
    ('{"answer": 42, "name": "x"}', None, [], 0),
    ('{"name": "Alice", "age": 30}', None, [], 0),
    ('{"name": "ping"}', None, [], 0),
    ('{"parameters": {}, "name": "ping"}', None, [], 0),
    ('{"type": "function", "type": "x"}', None, [], 0),
    ('{"type": "object"} is a schema.', None, [], 0),
    ("{}", None, [], 0),
    # a brace later in the answer is text
    ('The set {"name": "a"} is small.', None, [], 0),
    # malformed
    ('{"name": "get_weather", "parameters": {"city": "Paris",}}', "", [], 1),
    ('<|python_tag|>brave_search.call(query="weather")', "", [], 1),
]

MISTRAL_CASES = [
    # Mistral-7B-Instruct-v0.3
    ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Madrid"}, "id": "a1B2c3D4e"}]', "",
     [("get_weather", {"city": "Madrid"})], 0),
    ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Köln"}}, '
     '{"name": "web-search", "arguments": {"query": "\\"quoted\\" \\n line"}}]', "",
     [("get_weather", {"city": "Köln"}), ("web-search", {"query": '"quoted" \n line'})], 0),
    # Mistral Small 3.2 / Devstral (tokenizer v11+), with and without a call id
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Porto"}[TOOL_CALLS]web-search[CALL_ID]x9Y8z7W6v[ARGS]'
     '{"query": "porto wine"}', "",
     [("get_weather", {"city": "Porto"}), ("web-search", {"query": "porto wine"})], 0),
    # text before the call
    ('Sure thing. [TOOL_CALLS] [{"name": "ping", "arguments": {}}]', "Sure thing.", [("ping", {})], 0),
    # malformed
    ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"]}]', "", [], 1),
    ('[TOOL_CALLS]get_weather[ARG]{"city": "Paris"}', "", [], 1),
    ("No tools needed [TOOL_CALL] here.", None, [], 0),
]

JSON_CASES = [
    # gemma-3-270m (base) under the transcript template, constrained: a leading space after "Assistant:"
    (' Tool call: {"name": "get_weather", "arguments": {"city": "Paris"}}', "",
     [("get_weather", {"city": "Paris"})], 0),
    (' Tool call: {"name": "get_weather", "arguments": {"city": "Paris"}}\n'
     'Tool call: {"name": "web-search", "arguments": {"query": "\\u00e9t\\u00e9 à Paris"}}', "",
     [("get_weather", {"city": "Paris"}), ("web-search", {"query": "été à Paris"})], 0),
    # unconstrained: text, a broken call (to the end of its line), then a good one
    ('I will call it.\nTool call: {"name": "get_weather", "arguments": {"city": }}\n'
     'Tool call: {"name": "ping", "arguments": {}}', "I will call it.", [("ping", {})], 1),
    (" Paris is the capital of France.", None, [], 0),
]

ALL_CASES = ([("hermes", *c) for c in HERMES_CASES] + [("llama3", *c) for c in LLAMA3_CASES]
             + [("mistral", *c) for c in MISTRAL_CASES] + [("json", *c) for c in JSON_CASES])


@pytest.mark.parametrize("fmt,output,text,calls,n_errors", ALL_CASES)
def test_recorded_outputs_parse_the_same_in_any_pieces(fmt, output, text, calls, n_errors):
    result = parse_everywhere(fmt, output)
    assert result.text == (output if text is None else text)
    assert calls_of(result) == calls
    assert len(result.errors) == n_errors


def test_mistral_v11_parser_reads_both_mistral_forms():
    for output, _, calls, _ in MISTRAL_CASES[:3]:
        assert calls_of(FORMATS["mistral-v11"].parse(output)) == calls


def test_a_malformed_call_keeps_its_raw_text_and_never_becomes_a_call():
    out = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>\nSorry.')
    events, result = run("hermes", [out])
    (err,) = result.errors
    assert err.raw == out[:-len("\nSorry.")]
    assert (err.index, err.name) == (0, "get_weather") and "expected ','" in err.reason
    assert result.calls == () and result.text == "Sorry."
    assert [type(e).__name__ for e in events] == ["CallStart", "ArgsPiece", "CallFailed", "TextPiece"]

    result = FORMATS["json"].parse('Tool call: {"name": "get_weather", "arguments": {"city": 1e}}')
    assert result.errors[0].raw == 'Tool call: {"name": "get_weather", "arguments": {"city": 1e}}'
    assert "not valid JSON" in result.errors[0].reason

    result = FORMATS["hermes"].parse('<tool_call>\n{"name": "f", "arguments": {"x": NaN}}\n</tool_call>')
    assert result.calls == () and "NaN" in result.errors[0].reason

    result = FORMATS["hermes"].parse('<tool_call>\n{"name": "f", "arguments": [1, 2]}\n</tool_call>')
    assert result.calls == () and "JSON object" in result.errors[0].reason

    # broken before the name: no CallStart, no index
    result = FORMATS["mistral"].parse("[TOOL_CALLS] oops")
    assert result.errors[0].index is None and result.errors[0].raw == "[TOOL_CALLS] oops"


def test_text_that_may_open_a_call_is_held_back_until_resolved():
    p = FORMATS["hermes"].parser(ids())
    assert p.feed("Hello <tool_c") == [TextPiece("Hello")]
    assert p.feed("ar") == [TextPiece(" <tool_car")]
    assert p.feed("t\n<tool") == [TextPiece("t")]
    assert p.feed('_call>{"name": "ping"') == [CallStart(0, "call_0", "ping")]
    assert p.feed(', "arguments": {"a": ') == [ArgsPiece(0, '{"a": ')]
    assert p.feed("1}}") == [ArgsPiece(0, "1}"), CallEnd(0, ToolCall("call_0", "ping", '{"a": 1}'))]
    assert p.finish() == []
    assert p.text == "Hello <tool_cart"


def test_a_bare_llama_call_starts_once_its_arguments_key_is_read():
    p = FORMATS["llama3"].parser(ids())
    assert p.feed(' {"name": "get_weather", ') == []
    assert p.feed('"parameters": {"ci') == [CallStart(0, "call_0", "get_weather"), ArgsPiece(0, '{"ci')]
    assert p.feed('ty": "Oslo"}}') == [ArgsPiece(0, 'ty": "Oslo"}'),
                                      CallEnd(0, ToolCall("call_0", "get_weather", '{"city": "Oslo"}'))]
    p = FORMATS["llama3"].parser(ids())
    assert p.feed('{"name": "Alice", "age"') == [TextPiece('{"name": "Alice", "age"')]


def test_framing_whitespace_is_dropped_and_plain_text_is_untouched():
    result = FORMATS["hermes"].parse('  Hi.  \n\n<tool_call>\n{"name": "ping"}\n</tool_call>\n\n  Bye.\n')
    assert result.text == "  Hi.Bye.\n"
    text = "  Two lines\n\nwith spaces  \n"
    for fmt in FORMATS.values():
        assert fmt.parse(text).text == text


def test_arguments_before_the_name_are_sent_after_call_start():
    events, result = run("hermes", ['<tool_call>{"arguments": {"city": "Oslo"}, "name": "get_weather"}'])
    assert [type(e) for e in events] == [CallStart, ArgsPiece, CallEnd]
    assert events[1].text == '{"city": "Oslo"}' == result.calls[0].arguments


def test_feed_after_finish_is_a_bug():
    p = FORMATS["json"].parser()
    p.finish()
    with pytest.raises(RuntimeError):
        p.feed("x")


# -- rendering ----------------------------------------------------------------------------------------------------
CALLS = [ToolCall("call_abcdefghijklmnopqrstuvwx", "get_weather", '{"city":"Paris","unit":"celsius"}'),
         ToolCall("call_ABCDEFGHIJKLMNOPQRSTUVWX", "web-search", '{"query": "été", "limit": 2}')]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_rendered_calls_parse_back_to_the_same_calls(name):
    fmt = FORMATS[name]
    for calls in (CALLS[:1], CALLS):
        result = fmt.parse(fmt.render_calls(calls))
        assert [(c.name, json.loads(c.arguments)) for c in result.calls] == \
            [(c.name, json.loads(c.arguments)) for c in calls]
        assert result.text == "" and result.errors == ()


def test_render_golden_strings():
    call = CALLS[0]
    assert FORMATS["hermes"].render_calls([call]) == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>')
    assert FORMATS["hermes"].render_result(call, "18°C") == ("user", "<tool_response>\n18°C\n</tool_response>")
    assert FORMATS["llama3"].render_calls([call]) == (
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}')
    assert FORMATS["llama3"].render_result(call, '{"t": 18}') == ("ipython", '{"t": 18}')
    assert FORMATS["mistral"].render_calls([call]) == (
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}, '
        '"id": "pqrstuvwx"}]')
    assert FORMATS["mistral"].render_result(call, "18 C") == (
        "tool", '[TOOL_RESULTS] {"content": "18 C", "call_id": "pqrstuvwx"}[/TOOL_RESULTS]')
    assert FORMATS["mistral"].render_result(call, '{"t": 18}')[1].startswith('[TOOL_RESULTS] {"content": {"t": 18}')
    assert FORMATS["mistral-v11"].render_calls([call]) == (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}')
    assert FORMATS["json"].render_calls(CALLS, content="Let me see.") == (
        'Let me see.\nTool call: {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
        'Tool call: {"name": "web-search", "arguments": {"query": "été", "limit": 2}}')
    assert FORMATS["json"].render_result(call, "18 C") == ("user", "Tool result: 18 C")
    for fmt in FORMATS.values():
        assert fmt.render_result(call, "x")[0] == fmt.result_role


def test_system_texts_describe_every_tool():
    for fmt in FORMATS.values():
        text = fmt.system_text(TOOLS)
        for tool in TOOLS:
            assert json.dumps(tool.name) in text
        assert '"City name"' in text
    hermes = FORMATS["hermes"].system_prompt(TOOLS, "You are terse.")
    assert hermes.startswith("You are terse.\n\n# Tools\n") and "<tools>\n{" in hermes
    assert hermes.endswith('<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
    assert FORMATS["llama3"].system_prompt(TOOLS, "Be terse.").startswith("Environment: ipython\n")
    assert FORMATS["mistral"].system_text(TOOLS).startswith('[AVAILABLE_TOOLS] [{"type": "function"')
    json_text = FORMATS["json"].system_text(TOOLS)
    assert json_text.startswith("The following is a conversation between a User and")
    assert '\nAssistant: Tool call: {"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}\n\n' in json_text
    assert json_text.splitlines()[-1] == json.dumps(
        {"name": "ping", "description": "", "parameters": {"type": "object", "properties": {}}})
    # the one-shot example must read as a call to the json parser, and its example tool is not a real one
    example = FORMATS["json"].parse(json_text)
    assert [c.name for c in example.calls] == ["get_time"]


# -- grammars (structure here; llama.cpp below) -----------------------------------------------------------------
def _defined_and_used(gbnf: str) -> tuple[set[str], set[str]]:
    defined, used = set(), set()
    for line in gbnf.splitlines():
        name, body = line.split(" ::= ", 1)
        defined.add(name)
        body = re.sub(r'"(\\.|[^"\\])*"|\[(\\.|[^\]\\])*\]|\{[0-9,]*\}', " ", body)
        used |= set(re.findall(r"[a-zA-Z0-9-]+", body))
    return defined, used


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_grammars_are_closed_and_only_for_forced_calls(name):
    fmt = FORMATS[name]
    assert fmt.grammar(TOOLS, ToolChoice("auto"), True) is None
    assert fmt.grammar(TOOLS, ToolChoice("none"), True) is None
    for choice in (ToolChoice("required"), ToolChoice("function", "web-search")):
        for parallel in (False, True):
            gbnf = fmt.grammar(TOOLS, choice, parallel)
            assert gbnf.startswith("root ::= ")
            defined, used = _defined_and_used(gbnf)
            assert used <= defined, used - defined
            assert len(defined) == len(gbnf.splitlines())  # no rule defined twice
    named = fmt.grammar(TOOLS, ToolChoice("function", "web-search"), False)
    assert "web-search" in named and "get_weather" not in named
    with pytest.raises(InvalidRequest) as ei:
        fmt.grammar(TOOLS, ToolChoice("function", "nope"), False)
    assert ei.value.param == "tool_choice"


def test_rule_renaming_leaves_literals_classes_and_repetitions_alone():
    gbnf = 'root ::= "{" space 0 "root space" [a-z0] x{0,2}\n0 ::= "0"\nspace ::= " "?\nx ::= [\\]x]'
    assert prefixed_rules(gbnf, "t1-") == [
        't1-root ::= "{" t1-space t1-0 "root space" [a-z0] t1-x{0,2}', 't1-0 ::= "0"', 't1-space ::= " "?',
        't1-x ::= [\\]x]']


def test_a_property_named_like_a_grammar_rule_does_not_collide():
    tools = parse_tools([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"call": {"type": "object", "properties": {"x": {"type": "string"}}},
                                         "call-0": {"type": "array", "items": {"type": "integer"}}}}}}])
    gbnf = FORMATS["hermes"].grammar(tools, ToolChoice("required"), True)
    defined, used = _defined_and_used(gbnf)
    assert used <= defined and len(defined) == len(gbnf.splitlines())
    assert {"root", "call", "call-0", "t0-root", "t0-call", "t0-call-0"} <= defined


# The grammar checker runs llama.cpp in a child process: it loads only the vocabulary (about a second), then for
# each case compiles the grammar and feeds the text token by token, asking the grammar sampler whether each token
# (and finally end-of-generation) is allowed.
_CHECKER = r'''
import ctypes, json, math, sys
import llama_cpp as L
cases = json.load(sys.stdin)
_log = L.llama_log_callback(lambda *a: None)
L.llama_log_set(_log, ctypes.c_void_p(0))
params = L.llama_model_default_params()
params.vocab_only = True
model = L.llama_model_load_from_file(cases.pop(0).encode(), params)
vocab = L.llama_model_get_vocab(model)
eos = L.llama_vocab_eos(vocab)
def tokens(text):
    raw = text.encode()
    buf = (L.llama_token * (len(raw) + 8))()
    return list(buf[:L.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, False)])
def check(gbnf, text):
    smpl = L.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    if not smpl:
        return "does not compile"
    try:
        for tok in tokens(text) + [eos]:
            data = (L.llama_token_data * 1)(L.llama_token_data(tok, 0.0, 0.0))
            arr = L.llama_token_data_array(data, 1, -1, False)
            L.llama_sampler_apply(smpl, ctypes.byref(arr))
            if math.isinf(data[0].logit):
                return "end refused" if tok == eos else f"refused at token {tok}"
            if tok != eos:
                L.llama_sampler_accept(smpl, tok)
        return "ok"
    finally:
        L.llama_sampler_free(smpl)
print(json.dumps([check(g, t) for g, t in cases]))
'''


def llama_cpp_check(model_path: str, cases: list[tuple[str, str]]) -> list[str]:
    r = subprocess.run([sys.executable, "-c", _CHECKER], input=json.dumps([model_path, *cases]),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.model
def test_llama_cpp_accepts_each_family_grammar_for_exactly_its_call_text(bundled_model):
    call_w, call_s = CALLS[0], ToolCall("call_x", "web-search", '{"query": "a \\"b\\" é\\n", "limit": 2}')
    bad_name = ToolCall("call_y", "get_wether", '{"city": "Paris"}')
    bad_args = ToolCall("call_z", "get_weather", '{"town": "Paris"}')
    newline_in_string = ToolCall("call_n", "get_weather", '{"city": "Par\nis"}')
    cases, expect = [], []
    for name, fmt in sorted(FORMATS.items()):
        required_1 = fmt.grammar(TOOLS, ToolChoice("required"), False)
        required_n = fmt.grammar(TOOLS, ToolChoice("required"), True)
        named = fmt.grammar(TOOLS, ToolChoice("function", "web-search"), False)
        no_args = fmt.grammar(TOOLS, ToolChoice("function", "ping"), False)

        def text(calls: list[ToolCall]) -> str:  # the transcript prompt ends in "Assistant:"
            return (" " if name == "json" else "") + fmt.render_calls(calls)

        for gbnf, calls, ok in [
            (required_1, [call_w], True), (required_1, [call_s], True), (required_1, [call_w, call_s], False),
            (required_n, [call_w, call_s], True), (required_n, [call_s, call_w, call_s], True),
            (named, [call_s], True), (named, [call_w], False), (no_args, [ToolCall("c", "ping", "{}")], True),
            (required_1, [bad_name], False), (required_1, [bad_args], False),
            (required_1, [newline_in_string], False),
        ]:
            cases.append((gbnf, text(calls)))
            expect.append((name, [c.name for c in calls], ok))
    results = llama_cpp_check(str(bundled_model), cases)
    wrong = [(e, r) for e, r in zip(expect, results) if (r == "ok") != e[2] or r == "does not compile"]
    assert not wrong, wrong


@pytest.mark.model
def test_llama_cpp_checker_refuses_what_it_should(bundled_model):
    results = llama_cpp_check(str(bundled_model), [('root ::= "a" [0-9]{2}', "a12"), ('root ::= "a"', "ab"),
                                                   ('root ::= "a" [0-9]{2}', "a1"), ("root ::= (", "x")])
    assert results[0] == "ok" and results[1].startswith("refused at") and results[2:] == [
        "end refused", "does not compile"]


# -- format_for -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("template_name,arch,chat_template,expected", [
    ("gguf", "qwen2", "{% for m in messages %}<|im_start|>...<tool_call>\\n{{ tool_call }}{% endfor %}", "hermes"),
    ("gguf", "llama", "<|start_header_id|>ipython<|end_header_id|>", "llama3"),
    ("gguf", "llama", "{{- '<|python_tag|>' + tool_call.name }}", "llama3"),
    ("gguf", "llama", "[AVAILABLE_TOOLS] [TOOL_CALLS] [", "mistral"),
    ("gguf", "mistral3", "[TOOL_CALLS]{{ name }}[ARGS]{{ args }}", "mistral-v11"),
    ("transcript", "gemma3", None, "json"),
    ("gemma", "gemma3", None, "json"),
    ("gguf", "gemma3", "<start_of_turn>user", "json"),
    ("chatml", "phi3", None, "hermes"),
    ("llama-3", "llama", None, "llama3"),
    ("mistral", "llama", None, "mistral"),
    ("gguf", "qwen2", "<|im_start|>{{ m.content }}", "hermes"),
    ("gguf", "phi3", "<|im_start|>{{ m.content }}", "hermes"),
    ("gguf", "llama", "<|start_header_id|>{{ m.role }}", "llama3"),
    ("gguf", "olmo", "<|user|>", "json"),
])
def test_format_for(template_name, arch, chat_template, expected):
    assert format_for(template_name, arch, chat_template).name == expected


# -- tool lists, tool_choice, validation --------------------------------------------------------------------------
def test_parse_tools_keeps_the_definitions():
    weather, search, ping = TOOLS
    assert (weather.name, weather.description, weather.strict) == ("get_weather", "Current weather in a city", False)
    assert weather.parameters == WEATHER["function"]["parameters"]
    assert search.strict and ping.parameters == {"type": "object", "properties": {}}
    assert ping.to_openai() == {"type": "function", "function": {
        "name": "ping", "description": "", "parameters": {"type": "object", "properties": {}}}}
    assert parse_tools(None) == () and parse_tools([]) == ()


def _tool(**fn: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", **fn}}


@pytest.mark.parametrize("raw,param,words", [
    ({"type": "function"}, "tools", "array"),
    ([WEATHER] * 1 + [_tool(name=f"f{i}") for i in range(MAX_TOOLS)], "tools", "at most 128"),
    ([WEATHER, "f"], "tools[1]", "object"),
    ([{"type": "retrieval"}], "tools[0].type", "'function'"),
    ([{"type": "function"}], "tools[0].function", "name"),
    ([WEATHER, {"type": "function", "function": {"description": "no name"}}], "tools[1].function.name", "1-64"),
    ([_tool(name="get weather")], "tools[0].function.name", "1-64"),
    ([_tool(name="x" * 65)], "tools[0].function.name", "1-64"),
    ([_tool(name="")], "tools[0].function.name", "1-64"),
    ([WEATHER, SEARCH, WEATHER], "tools[2].function.name", "tools[0]"),
    ([_tool(description=3)], "tools[0].function.description", "string"),
    ([_tool(strict="yes")], "tools[0].function.strict", "true or false"),
    ([_tool(parameters=[])], "tools[0].function.parameters", "JSON object"),
    ([_tool(parameters={"type": "string"})], "tools[0].function.parameters", "type 'object'"),
    ([_tool(parameters={"properties": {"a": {"type": "string"}}})], "tools[0].function.parameters", "'object'"),
    ([_tool(parameters={"type": "object", "properties": {"a": {"type": "strin"}}})],
     "tools[0].function.parameters", "invalid JSON schema"),
    ([_tool(parameters={"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}})],
     "tools[0].function.parameters", "local $ref"),
    ([_tool(parameters={"type": "object", "properties": {"a": {"type": "string", "description": "x" * 70000}}})],
     "tools[0].function.parameters", "larger than"),
    ([_tool(strict=True, parameters={"type": "object", "properties": {"e": {"type": "string", "format": "email"}}})],
     "tools[0].function.parameters", "format 'email'"),
])
def test_bad_tools_name_the_field(raw, param, words):
    with pytest.raises(InvalidRequest) as ei:
        parse_tools(raw)
    assert ei.value.param == param
    assert words in str(ei.value)


@pytest.mark.parametrize("prop,words", [({"type": "string", "maxLength": 987654321}, "over the limit of 256"),
                                        ({"type": "string", "maxLength": 300}, "over the limit of 256"),
                                        ({"enum": []}, "enum at schema.properties.a is empty")])
def test_grammars_are_built_only_for_a_forced_choice_and_refused_before_they_grow(prop, words, monkeypatch):
    """A bound the grammar converter would write out as that many nested groups (987654321 took 23 GB
    before the kernel killed the server) is refused before anything is built, and only when a grammar is
    needed: under "auto" the tool is fine. The converter is never called (counted, not timed)."""
    from app.engine.chat.tools import _gbnf_for, check_tool_grammars
    from app.engine.structured import grammar

    converted: list[str] = []
    convert = grammar._llama_grammar().json_schema_to_gbnf

    def counting(schema_json, *args, **kwargs):
        converted.append(schema_json)
        return convert(schema_json, *args, **kwargs)

    monkeypatch.setattr(grammar._llama_grammar(), "json_schema_to_gbnf", counting)
    tools = parse_tools([_tool(parameters={"type": "object", "properties": {"a": prop}})])
    check_tool_grammars(tools, parse_tool_choice("auto", tools))
    with pytest.raises(InvalidRequest) as ei:
        check_tool_grammars(tools, parse_tool_choice("required", tools))
    assert ei.value.param == "tools[0].function.parameters" and words in str(ei.value)
    assert converted == []  # refused before the converter built anything
    ok = parse_tools([_tool(parameters={"type": "object", "properties": {"a": {"type": "string", "maxLength": 8}}})])
    _gbnf_for.cache_clear()  # so that the spy sees this build
    check_tool_grammars(ok, parse_tool_choice("required", ok))
    assert len(converted) == 1  # a schema within the bounds is converted, and the spy sees it


def test_strict_tools_may_use_bounds_the_call_check_enforces():
    """pydantic's ``Field(ge=1)`` in a strict tool (openai-agents marks every tool strict): accepted, and a call
    outside the bound is caught after generation (docs/server.md, "Tools with structured output")."""
    (tool,) = parse_tools([_tool(strict=True, parameters={"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 1}}})])
    assert "minimum" in validate_call(ToolCall("c", "f", '{"n": 0}'), [tool])


def test_non_strict_tools_may_use_keywords_the_grammar_loosens():
    (tool,) = parse_tools([_tool(parameters={"type": "object", "properties": {"n": {"type": "integer",
                                                                                         "minimum": 1}}})])
    assert validate_call(ToolCall("c", "f", '{"n": 0}'), [tool]) == (
        "the arguments of 'f' do not match its schema: arguments.n: 0 is less than the minimum of 1")


def test_parse_tool_choice():
    assert parse_tool_choice(None, TOOLS) == ToolChoice("auto")
    assert parse_tool_choice(None, ()) == ToolChoice("none")
    assert parse_tool_choice("none", ()) == ToolChoice("none")
    assert parse_tool_choice("required", TOOLS).forces_call
    assert not parse_tool_choice("auto", TOOLS).forces_call
    named = parse_tool_choice({"type": "function", "function": {"name": "ping"}}, TOOLS)
    assert named == ToolChoice("function", "ping") and named.forces_call


@pytest.mark.parametrize("raw,tools,words", [
    ("always", TOOLS, "one of auto, none, required"),
    ({"type": "function", "function": {"name": "get_time"}}, TOOLS, "'get_time', which is not in tools"),
    ({"type": "function", "function": {"name": "ping"}}, (), "not in tools"),
    ({"type": "function"}, TOOLS, "must be"),
    ({"type": "tool", "function": {"name": "ping"}}, TOOLS, "must be"),
    ({"function": {"name": 3}}, TOOLS, "must be"),
    (3, TOOLS, "must be"),
    ("required", (), "no tools"),
])
def test_bad_tool_choice_names_the_field(raw, tools, words):
    with pytest.raises(InvalidRequest) as ei:
        parse_tool_choice(raw, tools)
    assert ei.value.param == "tool_choice"
    assert words in str(ei.value)


@pytest.mark.parametrize("call,problem", [
    (ToolCall("c", "get_weather", '{"city": "Paris", "unit": "celsius"}'), None),
    (ToolCall("c", "ping", "{}"), None),
    (ToolCall("c", "get_time", "{}"), "the model called 'get_time', which is not one of the tools"),
    (ToolCall("c", "get_weather", '{"city": '), "are not valid JSON"),
    (ToolCall("c", "get_weather", "[1]"), "must be a JSON object, got list"),
    (ToolCall("c", "get_weather", '{"unit": "celsius"}'), "'city' is a required property"),
    (ToolCall("c", "get_weather", '{"city": "Paris", "unit": "kelvin"}'), "arguments.unit: 'kelvin' is not one of"),
    (ToolCall("c", "web-search", '{"query": "q", "extra": 1}'), "Additional properties are not allowed"),
])
def test_validate_call(call, problem):
    got = validate_call(call, TOOLS)
    assert got == problem if problem is None else problem in got


def test_new_call_id_shape():
    a, b = new_call_id(), new_call_id()
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", a) and a != b
    assert ToolCall(a, "ping", "{}").to_openai() == {"id": a, "type": "function",
                                                     "function": {"name": "ping", "arguments": "{}"}}
