"""Tools and structured output in one request (issue 26) on the real bundled model (``model`` marker).

llama.cpp itself takes the joined grammar of "auto" + ``response_format`` (``ToolFormat.grammar``'s
``answer``) for exactly a call or an answer in the format, in every tool format. Then the port, through the
``openai`` client, as openai-agents drives it: a strict tool and a strict ``response_format`` from a pydantic
model with ``Field(ge=1, le=5)``, ``tool_choice="required"`` on both turns; the first turn is a call, the turn
after the tool result an object the SDK parses, within the bounds (the grammar lists 1..5). Greedy and short.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from engine_runs import served
from pydantic import BaseModel, Field
from test_tool_formats import llama_cpp_check

from app.engine.chat.tool_formats import FORMATS
from app.protocol.tools import ToolCall, ToolChoice, ToolSpec
from app.server.openai_schema import ResponseFormat
from app.server.structured import answer_problem, grammar_for

pytestmark = pytest.mark.model


class Rating(BaseModel):
    score: int = Field(ge=1, le=5, description="stars, 1 to 5")
    summary: str = Field(max_length=40)


LOOKUP_PARAMS = {"type": "object", "properties": {"product": {"type": "string", "maxLength": 40}},
                 "required": ["product"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "lookup_reviews", "description": "Customer reviews of a product",
                                         "parameters": LOOKUP_PARAMS, "strict": True}}


def test_llama_cpp_takes_the_joined_grammar_for_a_call_or_a_formatted_answer(bundled_model):
    fmt_json = {"type": "json_schema", "json_schema": {"name": "rating", "strict": True,
                                                       "schema": Rating.model_json_schema()}}
    answer = grammar_for(ResponseFormat.model_validate(fmt_json))
    tool = ToolSpec("lookup_reviews", "", LOOKUP_PARAMS, True)
    cases, expect = [], []
    for name, fmt in sorted(FORMATS.items()):
        g = fmt.grammar([tool], ToolChoice("auto"), False, answer)
        call = fmt.render_calls([ToolCall("c1", "lookup_reviews", '{"product": "kettle"}')])
        for text, ok in [(call, True), ('{"score": 4, "summary": "good"}', True),
                         ('{"score": 6, "summary": "good"}', False), ('{"score": 4}', False),
                         ("Four stars.", False), ('{"score": 4, "summary": "good"}' + call, False),
                         (fmt.render_calls([ToolCall("c1", "lookup", '{"product": "kettle"}')]), False)]:
            cases.append((g, text))
            expect.append((name, text, ok))
    any_object = grammar_for(ResponseFormat.model_validate({"type": "json_object"}))  # recursive, over lines
    g = FORMATS["json"].grammar([tool], ToolChoice("auto"), True, any_object)
    call = FORMATS["json"].render_calls([ToolCall("c1", "lookup_reviews", '{"product": "kettle"}')])
    for text, ok in [(call, True), ('{"a": [1, {"b": null}], "c": "d"}', True), ("[1, 2]", False),
                     ("Four stars.", False)]:
        cases.append((g, text))
        expect.append(("json_object", text, ok))
    results = llama_cpp_check(str(bundled_model), cases)
    wrong = [(e, r) for e, r in zip(expect, results) if (r == "ok") != e[2] or r == "does not compile"]
    assert not wrong, wrong


@pytest.fixture(scope="module")
def real(bundled_model):
    with served(bundled_model, max_queue=8) as srv:
        yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_a_forced_call_then_a_bounded_answer_after_the_tool_result(real):
    msgs: list = [{"role": "system", "content": "Rate products from their reviews."},
                  {"role": "user", "content": "How good is the Acme kettle? Look up its reviews, then rate it."}]
    kw = dict(model="gemma-3-270m-q4_k_m", tools=[TOOL], tool_choice="required", response_format=Rating,
              temperature=0, max_tokens=80)
    r = real.chat.completions.parse(messages=msgs, **kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch.message.content
    (call,) = ch.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), LOOKUP_PARAMS)
    assert call.function.name == "lookup_reviews" and ch.message.parsed is None
    msgs += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
             {"role": "tool", "tool_call_id": call.id,
              "content": '{"average_stars": 4.2, "reviews": 120, "common_praise": "boils fast"}'}]
    r = real.chat.completions.parse(messages=msgs, **kw)
    ch = r.choices[0]
    assert ch.finish_reason == "stop" and not ch.message.tool_calls, ch.message.content
    rating = ch.message.parsed  # the SDK validated it with Rating: bounds included
    assert isinstance(rating, Rating) and 1 <= rating.score <= 5 and len(rating.summary) <= 40
    strict = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {
        "name": "Rating", "schema": Rating.model_json_schema(), "strict": True}})
    assert answer_problem(ch.message.content, strict) is None


def test_auto_with_a_format_can_still_call_the_tool(real):
    msgs = [{"role": "system", "content": "Rate products from their reviews."},
            {"role": "user", "content": "How good is the Acme kettle? Look up its reviews, then rate it."}]
    r = real.chat.completions.create(model="gemma-3-270m-q4_k_m", messages=msgs, tools=[TOOL],
                                     response_format={"type": "json_object"}, temperature=0, max_tokens=60)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch.message.content  # the grammar let the model choose the call
    jsonschema.validate(json.loads(ch.message.tool_calls[0].function.arguments), LOOKUP_PARAMS)
