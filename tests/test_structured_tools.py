"""Tools and structured output in one request (issue 26): pure logic and the port over ``FakeEngine``.

Pure: the grammar ``ToolFormat.grammar`` joins from the tools and a ``response_format`` grammar under "auto"
(checked with a small GBNF-to-regex reader: it accepts a call and an answer in the format, nothing else; the
same grammars in llama.cpp itself are in test_structured_tools_real.py), small integer ranges written as enums,
the strict gates, ``tools_with_format`` and the check after generation (``answer_problem``). Fakes: how the
port maps auto + format, required + format and tool results + format onto the engine request, through the
``openai`` client.
"""

from __future__ import annotations

import json
import re

import openai
import pytest
from fakes import FakeEngine
from pydantic import BaseModel, Field

from app.engine.chat.tool_formats import FORMATS
from app.engine.chat.tools import parse_tools
from app.engine.structured.grammar import bounded_ints, int_range, schema_to_gbnf
from app.engine.structured.schema_check import unenforceable, value_problem
from app.errors import InvalidRequest
from app.protocol.tools import ToolCall, ToolChoice, ToolSpec
from app.protocol.types import ChatMessage
from app.server import ServerThread, create_app
from app.server.convert import tools_with_format
from app.server.models import ModelCatalog
from app.server.openai_schema import ResponseFormat
from app.server.structured import answer_problem, grammar_for
from app.settings import ServerSettings


class Rating(BaseModel):
    score: int = Field(ge=1, le=5)
    reason: str


RATING_SCHEMA = {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5},
                                                  "reason": {"type": "string"}},
                 "required": ["score", "reason"], "additionalProperties": False}
LOOKUP_PARAMS = {"type": "object", "properties": {"product": {"type": "string"}}, "required": ["product"],
                 "additionalProperties": False}
LOOKUP = ToolSpec("lookup_reviews", "Reviews of a product", LOOKUP_PARAMS, True)


# -- a GBNF reader for the converter's rule-per-line grammars (no recursion): the grammar as one regex ----------
_TOKEN = re.compile(r'\s+|"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\{\d*(?:,\d*)?\}|[a-zA-Z0-9-]+|[()|*+?]')


def gbnf_regex(gbnf: str, rule: str = "root", depth: int = 0) -> str:
    """``rule`` of ``gbnf`` as a Python regex, rules inlined (fails on recursion deeper than 30)."""
    rules = dict(line.split(" ::= ", 1) for line in gbnf.splitlines() if line.strip())
    assert depth < 30, "recursive grammar"
    body, out, pos = rules[rule], [], 0
    for m in _TOKEN.finditer(body):
        assert m.start() == pos, f"unread GBNF at {body[pos:]!r}"
        pos, tok = m.end(), m.group(0)
        if tok.isspace():
            continue
        if tok.startswith('"'):
            out.append("(?:" + re.escape(json.loads(tok)) + ")")
        elif tok.startswith("[") or tok.startswith("{") or tok in "|*+?)":
            out.append(tok)
        elif tok == "(":
            out.append("(?:")
        else:
            out.append("(?:" + gbnf_regex(gbnf, tok, depth + 1) + ")")
    assert pos == len(body), f"unread GBNF at {body[pos:]!r}"
    return "".join(out)


def accepts(gbnf: str, text: str) -> bool:
    return re.fullmatch(gbnf_regex(gbnf), text, re.S) is not None


def test_the_reader_refuses_what_it_should():
    g = 'root ::= "a" x{2} ( "b" | "c" )?\nx ::= [0-9]'
    assert accepts(g, "a12") and accepts(g, "a12c") and not accepts(g, "a1") and not accepts(g, "a12d")


# -- the joined grammar ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_auto_with_a_format_allows_a_call_or_an_answer_in_the_format_and_nothing_else(name):
    fmt = FORMATS[name]
    answer = grammar_for(ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"name": "rating", "schema": RATING_SCHEMA, "strict": True}}))
    g = fmt.grammar([LOOKUP], ToolChoice("auto"), False, answer)
    assert g.splitlines()[-len(answer.splitlines()) - 1].startswith("root ::= calls | a-root")
    names = [line.split(" ::= ")[0] for line in g.splitlines()]
    assert len(names) == len(set(names))  # the answer's rules do not clash with the tools'
    call = fmt.render_calls([ToolCall("c1", "lookup_reviews", '{"product": "kettle"}')])
    good = '{"score": 4, "reason": "mostly praise"}'
    assert accepts(g, call) and accepts(g, good) and accepts(g, '{"score":1,"reason":""}')
    for bad in ['{"score": 7, "reason": "x"}', '{"score": 0, "reason": "x"}', '{"reason": "x", "score": 4}',
                "It is good.", good + "\n" + call, call + good,
                fmt.render_calls([ToolCall("c1", "delete_all", '{"product": "kettle"}')]),
                fmt.render_calls([ToolCall("c1", "lookup_reviews", '{"item": "kettle"}')])]:
        assert not accepts(g, bad), bad


def test_parallel_calls_under_auto_with_a_format():
    fmt = FORMATS["json"]
    g = fmt.grammar([LOOKUP], ToolChoice("auto"), True, schema_to_gbnf(RATING_SCHEMA))
    two = fmt.render_calls([ToolCall("a", "lookup_reviews", '{"product": "a"}'),
                            ToolCall("b", "lookup_reviews", '{"product": "b"}')])
    assert accepts(g, two)
    assert not accepts(FORMATS["json"].grammar([LOOKUP], ToolChoice("auto"), False, schema_to_gbnf(RATING_SCHEMA)),
                       two)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_forced_and_none_ignore_the_answer_grammar(name):
    fmt, answer = FORMATS[name], schema_to_gbnf(RATING_SCHEMA)
    for choice in (ToolChoice("required"), ToolChoice("function", "lookup_reviews")):
        assert fmt.grammar([LOOKUP], choice, False, answer) == fmt.grammar([LOOKUP], choice, False)
    assert fmt.grammar([LOOKUP], ToolChoice("none"), False, answer) is None
    assert fmt.grammar([LOOKUP], ToolChoice("auto"), False) is None  # no format: free text, as before


def test_an_answer_grammar_the_reader_cannot_take_apart_is_a_400_naming_response_format():
    with pytest.raises(InvalidRequest) as ei:
        FORMATS["json"].grammar([LOOKUP], ToolChoice("auto"), False, "object\nroot ::= object")
    assert ei.value.param == "response_format"


def test_the_json_object_grammar_joins_too():
    """``json_object``'s grammar spans lines and has comments (llama-cpp-python's ``JSON_GBNF``): its rules
    are read whole and renamed like the converter's (it is recursive, so llama.cpp checks what it accepts:
    test_structured_tools_real.py)."""
    g = FORMATS["json"].grammar([LOOKUP], ToolChoice("auto"), False,
                                grammar_for(ResponseFormat.model_validate({"type": "json_object"})))
    rules = dict(line.split(" ::= ", 1) for line in g.splitlines())
    assert rules["root"] == "calls | a-root" and rules["a-root"] == "a-object"
    assert rules["a-object"].startswith('"{" a-ws ( a-string ":" a-ws a-value') and "#" not in g
    assert rules["a-ws"] == '| " " | "\\n" [ \\t]{0,20}'


# -- integer ranges the grammar enforces --------------------------------------------------------------------------
@pytest.mark.parametrize("node,values", [
    ({"type": "integer", "minimum": 1, "maximum": 5}, [1, 2, 3, 4, 5]),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3}, [1, 2]),
    ({"type": "integer", "minimum": 0.5, "maximum": 3.5}, [1, 2, 3]),
    ({"type": "integer", "minimum": -4, "maximum": 4, "multipleOf": 4}, [-4, 0, 4]),
    ({"type": "integer", "minimum": 1, "exclusiveMinimum": 2, "maximum": 3}, [3]),
    ({"type": "integer", "minimum": 1, "maximum": 64}, list(range(1, 65))),
    ({"type": "integer", "minimum": 5, "maximum": 1}, []),
    ({"type": "integer", "minimum": 1, "maximum": 65}, None),  # wider: checked after generation
    ({"type": "integer", "minimum": 1}, None),
    ({"type": "number", "minimum": 1, "maximum": 5}, None),
    ({"type": "integer", "minimum": 1, "maximum": 5, "multipleOf": 0.5}, None),
    ({"type": "integer", "minimum": True, "maximum": 5}, None),
    ({"type": "integer", "enum": [1, 9], "minimum": 1, "maximum": 5}, None),
])
def test_int_range(node, values):
    got = int_range(node)
    assert (list(got) if got is not None else None) == values


def test_bounded_ints_rewrites_every_schema_place_and_no_data():
    schema = {"type": "object", "properties": {
        "score": {"type": "integer", "minimum": 1, "maximum": 3, "description": "1-3"},
        "default": {"type": "integer", "minimum": 0, "maximum": 1},
        "list": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2}}},
        "default": {"score": {"type": "integer", "minimum": 1, "maximum": 3}},
        "$defs": {"d": {"anyOf": [{"type": "integer", "minimum": 7, "maximum": 8}]}}}
    out = bounded_ints(schema)
    assert out["properties"]["score"] == {"description": "1-3", "enum": [1, 2, 3]}
    assert out["properties"]["default"] == {"enum": [0, 1]}
    assert out["properties"]["list"]["items"] == {"enum": [0, 1, 2]}
    assert out["$defs"]["d"]["anyOf"][0] == {"enum": [7, 8]}
    assert out["default"] == schema["default"]  # a value, not a schema
    assert schema["properties"]["score"]["minimum"] == 1  # the request's schema is not changed


def test_a_small_range_is_enforced_and_a_wide_one_is_not():
    assert unenforceable(RATING_SCHEMA) == []
    wide = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 1000}}}
    assert unenforceable(wide) == ["'maximum' at schema.properties.n", "'minimum' at schema.properties.n"]
    g = schema_to_gbnf(RATING_SCHEMA)
    assert accepts(g, '{"score": 5, "reason": "r"}') and not accepts(g, '{"score": 6, "reason": "r"}')
    assert not accepts(g, '{"score": 10, "reason": "r"}')


def test_an_empty_range_is_a_400_not_an_unsatisfiable_grammar():
    with pytest.raises(InvalidRequest, match="empty"):
        schema_to_gbnf({"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}})


# -- the strict gates -----------------------------------------------------------------------------------------------
def strict_format(schema):
    return ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})


def test_strict_response_format_takes_pydantic_bounds_the_grammar_keeps():
    g = grammar_for(strict_format(Rating.model_json_schema()))
    assert 'score ::= "1" | "2" | "3" | "4" | "5"' in g


@pytest.mark.parametrize("node", [{"type": "integer", "minimum": 0, "maximum": 1000},
                                  {"type": "number", "minimum": 0, "maximum": 1}])
def test_strict_response_format_takes_keywords_checked_after_generation(node):
    """The port checks each answer against them (``structured.check_answer``: a 422, test_structured_422.py)."""
    assert grammar_for(strict_format({"type": "object", "properties": {"n": node}}))


def test_strict_response_format_refuses_a_format_the_grammar_does_not_know():
    with pytest.raises(InvalidRequest) as ei:
        grammar_for(strict_format({"type": "object", "properties": {"n": {"type": "string", "format": "email"}}}))
    assert ei.value.param == "response_format" and "format 'email'" in ei.value.message


def test_strict_tools_take_keywords_checked_after_generation():
    params = {"type": "object", "properties": {"stars": {"type": "number", "minimum": 0, "maximum": 5},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 1000,
                                                     "multipleOf": 10}}}
    (spec,) = parse_tools([{"type": "function", "function": {"name": "f", "strict": True, "parameters": params}}])
    assert spec.strict and spec.parameters == params
    with pytest.raises(InvalidRequest) as ei:  # a format jsonschema does not assert on tool calls
        parse_tools([{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
            "type": "object", "properties": {"e": {"type": "string", "format": "email"}}}}}])
    assert ei.value.param == "tools[0].function.parameters" and "format 'email'" in ei.value.message


# -- the request mapping, pure -------------------------------------------------------------------------------------
ASKED = (ChatMessage("user", "Rate the kettle."),)
ANSWERED = ASKED + (ChatMessage("assistant", "", (ToolCall("c1", "lookup_reviews", '{"product": "k"}'),)),
                    ChatMessage("tool", '{"stars": 4}', tool_call_id="c1"))


@pytest.mark.parametrize("messages,choice,grammar,expected", [
    (ASKED, ToolChoice("auto"), "G", (ToolChoice("auto"), "G")),
    (ANSWERED, ToolChoice("auto"), "G", (ToolChoice("auto"), "G")),
    (ASKED, ToolChoice("required"), "G", (ToolChoice("required"), None)),
    (ANSWERED, ToolChoice("required"), "G", (ToolChoice("none"), "G")),
    (ASKED, ToolChoice("function", "lookup_reviews"), "G", (ToolChoice("function", "lookup_reviews"), None)),
    (ANSWERED, ToolChoice("function", "lookup_reviews"), "G", (ToolChoice("none"), "G")),
    (ANSWERED, ToolChoice("required"), None, (ToolChoice("required"), None)),
    (ASKED, ToolChoice("none"), "G", (ToolChoice("none"), "G")),
])
def test_tools_with_format(messages, choice, grammar, expected):
    assert tools_with_format(messages, choice, grammar) == expected


# -- the check after generation --------------------------------------------------------------------------------------
def test_value_problem_names_the_place_the_keyword_and_the_value():
    schema = {"type": "object", "properties": {"x": {"type": "number", "exclusiveMaximum": 1.5},
                                               "tags": {"type": "array", "items": {"type": "integer",
                                                                                   "multipleOf": 3}},
                                               "e": {"type": "string", "format": "email"}}}
    assert value_problem({"x": 1.5}, schema) == \
        "answer.x: 1.5 is greater than or equal to the maximum of 1.5 (keyword 'exclusiveMaximum', value 1.5)"
    assert value_problem({"tags": [3, 4]}, schema) == \
        "answer.tags[1]: 4 is not a multiple of 3 (keyword 'multipleOf', value 4)"
    assert "keyword 'format'" in value_problem({"e": "not-an-address"}, schema)
    assert value_problem({"x": 1.4, "tags": [6], "e": "a@b.example"}, schema) is None


def test_answer_problem():
    fmt = strict_format(RATING_SCHEMA)
    assert answer_problem('{"score": 4, "reason": "ok"}', fmt) is None
    assert answer_problem('{"score": 9, "reason": "ok"}', fmt) == \
        "answer.score: 9 is greater than the maximum of 5 (keyword 'maximum', value 9)"
    assert answer_problem('{"score": 4, "rea', fmt).startswith("the answer is not JSON")
    assert answer_problem("[1]", ResponseFormat.model_validate({"type": "json_object"})) == \
        "the answer is a JSON list, not an object"
    assert answer_problem("free text", None) is None
    assert answer_problem("free text", ResponseFormat.model_validate({"type": "text"})) is None


# -- the port over the fake engine --------------------------------------------------------------------------------
TOOL = {"type": "function", "function": {"name": "lookup_reviews", "description": "Reviews of a product",
                                         "parameters": LOOKUP_PARAMS, "strict": True}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "rating", "schema": RATING_SCHEMA, "strict": True}}
CALL = 'Tool call: {"name": "lookup_reviews", "arguments": {"product": "kettle"}}'
USER = [{"role": "user", "content": "Rate the kettle."}]
AFTER = USER + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "lookup_reviews", "arguments": '{"product": "k"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"stars": 4}'}]


@pytest.fixture(scope="module")
def fake():
    replies = {"answer": CALL}
    eng = FakeEngine(reply=lambda req: replies["answer"])
    catalog = ModelCatalog(lambda: [("fake-model", "fake-model.gguf", "chat")])
    with ServerThread(create_app(eng, ServerSettings(), catalog=catalog)) as srv:
        yield eng, openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=60), replies


def test_fake_auto_with_a_format_keeps_both_and_reads_either(fake):
    eng, c, replies = fake
    replies["answer"] = CALL
    r = c.chat.completions.create(model="fake-model", messages=USER, tools=[TOOL], response_format=FORMAT)
    req = eng.seen[-1]
    assert req.tool_choice.mode == "auto" and req.tools[0].name == "lookup_reviews"
    assert req.decoding.grammar == grammar_for(ResponseFormat.model_validate(FORMAT))
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.tool_calls[0].function.name == \
        "lookup_reviews"
    replies["answer"] = '{"score": 4, "reason": "mostly praise"}'
    r = c.chat.completions.create(model="fake-model", messages=USER, tools=[TOOL], response_format=FORMAT)
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert Rating.model_validate_json(r.choices[0].message.content).score == 4


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "lookup_reviews"}}])
def test_fake_forced_choice_calls_first_then_answers_in_the_format(fake, choice):
    eng, c, replies = fake
    replies["answer"] = CALL
    r = c.chat.completions.create(model="fake-model", messages=USER, tools=[TOOL], tool_choice=choice,
                                  response_format=FORMAT)
    req = eng.seen[-1]
    assert req.tool_choice.forces_call and req.decoding.grammar is None  # the format waits for the answer
    assert r.choices[0].finish_reason == "tool_calls"
    replies["answer"] = '{"score": 5, "reason": "praise"}'
    r = c.chat.completions.create(model="fake-model", messages=AFTER, tools=[TOOL], tool_choice=choice,
                                  response_format=FORMAT)
    req = eng.seen[-1]
    assert req.tool_choice.mode == "none" and req.tools and req.decoding.grammar == grammar_for(
        ResponseFormat.model_validate(FORMAT))
    assert Rating.model_validate_json(r.choices[0].message.content) == Rating(score=5, reason="praise")


def test_fake_auto_after_tool_results_keeps_the_tools_and_the_format(fake):
    eng, c, replies = fake
    replies["answer"] = '{"score": 3, "reason": "mixed"}'
    r = c.chat.completions.create(model="fake-model", messages=AFTER, tools=[TOOL], response_format=FORMAT)
    assert eng.seen[-1].tool_choice.mode == "auto" and eng.seen[-1].decoding.grammar
    assert Rating.model_validate_json(r.choices[0].message.content).score == 3


def test_fake_strict_bounds_are_enforced_by_the_grammar_or_checked_after(fake):
    eng, c, replies = fake
    replies["answer"] = '{"score": 2, "reason": "r"}'
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"n": {"type": "number", "minimum": 0, "maximum": 1e6}}}}}
    r = c.chat.completions.parse(model="fake-model", messages=USER, tools=[tool], response_format=Rating)
    assert r.choices[0].message.parsed == Rating(score=2, reason="r")
    assert 'score ::= "1" | "2" | "3" | "4" | "5"' in eng.seen[-1].decoding.grammar
    wide = {"type": "json_schema", "json_schema": {"name": "w", "strict": True, "schema": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 1000}}}}}
    replies["answer"] = '{"n": 1001}'
    with pytest.raises(openai.UnprocessableEntityError) as ei:
        c.chat.completions.create(model="fake-model", messages=USER, response_format=wide)
    assert ei.value.param == "response_format" and "answer.n: 1001 is greater than the maximum of 1000" in \
        ei.value.message


def test_fake_auto_with_a_format_compiles_every_tool_first(fake):
    _eng, c, _replies = fake
    huge = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "maxLength": 5000}}}}}
    c.chat.completions.create(model="fake-model", messages=USER, tools=[huge])  # no grammar: fine
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="fake-model", messages=USER, tools=[huge], response_format=FORMAT)
    assert ei.value.param == "tools[0].function.parameters"
