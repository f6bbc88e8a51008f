"""How a conversation with tools, calls and results reaches the model (issue 13), pure: each built-in
template's prompt, a GGUF template that renders tools itself and one that does not (polyfilled with the
model's ToolFormat), the stop strings and grammar a request gets, the message checks, and the one reader of
answers (``ToolStream``) that every adapter uses. No model."""

from __future__ import annotations

import json

import pytest

from app.engine.chat.templates import render, template_tool_caps, tool_format
from app.engine.chat.tool_formats import FORMATS
from app.engine.chat.tool_parser import ArgsPiece, CallEnd, CallStart, TextPiece
from app.engine.chat.tool_stream import ToolsDone, ToolStream, stream_tools
from app.engine.chat.tools import parse_tools
from app.errors import InvalidRequest
from app.protocol.tools import ToolCall, ToolChoice
from app.protocol.types import ChatMessage, DecodingParams, Delta, Done, GenerateRequest, Metrics

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
TOOLS = parse_tools([WEATHER, TIME])
CALL = ToolCall("call_abcdefghijklmnopqrstuvwx", "get_weather", '{"city":"Paris"}')
CALL2 = ToolCall("call_zyxwvutsrqponmlkjihgfedc", "get_time", '{"tz": "Europe/Paris"}')
CONVO = (ChatMessage("system", "Be brief."), ChatMessage("user", "Weather and time in Paris?"),
         ChatMessage("assistant", "", (CALL, CALL2)),
         ChatMessage("tool", '{"temp": 18}', tool_call_id=CALL.id),
         ChatMessage("tool", "14:05", tool_call_id=CALL2.id))

# A Hermes-style template (the shape of Qwen2.5's): tools as JSON lines, calls with ``arguments | tojson``,
# results as <tool_response> in a user turn.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n"
    "{% endif %}# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' or (m.role == 'assistant' and not m.tool_calls) %}"
    "\n<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>"
    "{%- elif m.role == 'assistant' %}\n<|im_start|>assistant{% if m.content %}\n{{ m.content }}{% endif %}"
    "{%- for tc in m.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}\n<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>{% endif %}"
    "{%- endif %}{%- endfor %}\n<|im_start|>assistant\n").replace("%}\n", "%}{{ '\\n' }}")  # trim_blocks

# A chat template that knows nothing of tools and refuses roles it does not know (as Gemma's does).
PLAIN_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role not in ['system', 'user', 'assistant'] %}{{ raise_exception('unknown role ' + m.role) }}"
    "{% endif %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}<|assistant|>")

# Mistral v3's rule: call ids are exactly 9 letters/digits.
MISTRAL_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'user' %}"
    "{% if tools and loop.last %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "[INST] {{ m.content }}[/INST]"
    "{% elif m.tool_calls %}[TOOL_CALLS] [{% for tc in m.tool_calls %}"
    "{% if tc.id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{% endif %}{\"name\": \"{{ tc.function.name }}\", \"arguments\": {{ tc.function.arguments | tojson }}, "
    "\"id\": \"{{ tc.id }}\"}{% endfor %}]</s>"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS] {\"content\": {{ m.content }}, \"call_id\": \"{{ m.tool_call_id }}\"}"
    "[/TOOL_RESULTS]{% else %} {{ m.content }}</s>{% endif %}{% endfor %}")


# -- the built-in templates, each with its family's text -------------------------------------------------
def test_transcript_gets_the_json_format_with_calls_and_results_in_its_turns():
    rp = render(CONVO, "transcript", tools=TOOLS)
    assert rp.tool_format == "json" and rp.grammar is None
    assert rp.stop == ("\n\n", "\nUser:", "User:", "Tool result:")
    head, _, convo = rp.text.partition("Be brief.\n\n")
    assert head.startswith(FORMATS["json"].system_text(TOOLS)) and "{\"name\": \"get_time\"" in head
    assert convo == ('User: Weather and time in Paris?\n'
                     'Assistant: Tool call: {"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                     'Tool call: {"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n\n'
                     'User: Tool result: {"temp": 18}\nTool result: 14:05\n'
                     'Assistant:')


def test_chatml_gets_hermes_blocks():
    rp = render(CONVO, "chatml", tools=TOOLS)
    assert rp.tool_format == "hermes" and rp.stop == ("<|im_end|>", "<tool_response>")
    assert rp.text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>'
            '<|im_end|>\n<|im_start|>user\n<tool_response>\n{"temp": 18}\n</tool_response>\n<tool_response>\n'
            '14:05\n</tool_response><|im_end|>\n<|im_start|>assistant\n') in rp.text


def test_llama3_gets_ipython_turns_and_the_tools_before_the_system_message():
    rp = render(CONVO, "llama-3", tools=TOOLS)
    assert rp.tool_format == "llama3"
    assert rp.text.startswith("<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n")
    assert "Be brief.<|eot_id|>" in rp.text
    assert ('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": '
            '"Paris"}}\n{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}<|eot_id|>'
            '<|start_header_id|>ipython<|end_header_id|>\n\n{"temp": 18}<|eot_id|>'
            '<|start_header_id|>ipython<|end_header_id|>\n\n14:05<|eot_id|>') in rp.text
    assert rp.text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_mistral_gets_available_tools_before_the_last_user_turn_and_raw_results():
    convo = CONVO + (ChatMessage("assistant", "Sunny, 18°C, 14:05."), ChatMessage("user", "Thanks"))
    rp = render(convo, "mistral", tools=TOOLS)
    assert rp.tool_format == "mistral" and rp.stop == ("[TOOL_RESULTS]",)
    # ids are the last 9 letters/digits of ours; a call turn has no leading space
    assert ('[/INST][TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "pqrstuvwx"}, '
            '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}, "id": "kjihgfedc"}]</s>') in rp.text
    assert ('</s>[TOOL_RESULTS] {"content": {"temp": 18}, "call_id": "pqrstuvwx"}[/TOOL_RESULTS]'
            '[TOOL_RESULTS] {"content": "14:05", "call_id": "kjihgfedc"}[/TOOL_RESULTS]') in rp.text
    assert rp.text.endswith("[/TOOL_RESULTS] Sunny, 18°C, 14:05.</s>" + FORMATS["mistral"].system_text(TOOLS)
                            + "[INST] Thanks [/INST]")


def test_gemma_merges_the_tool_block_into_the_first_user_turn():
    rp = render(CONVO, "gemma", tools=TOOLS)
    assert rp.tool_format == "json"
    assert rp.text.startswith("<start_of_turn>user\n" + FORMATS["json"].system_text(TOOLS) + "\n\nBe brief.")
    assert "<start_of_turn>user\nTool result: {\"temp\": 18}\nTool result: 14:05<end_of_turn>" in rp.text


def test_history_with_calls_renders_even_when_the_request_offers_no_tools():
    rp = render(CONVO, "transcript")
    assert rp.tool_format == "" and rp.stop == ("\n\n", "\nUser:", "User:")
    assert rp.text.startswith("Be brief.\n\nUser: Weather") and "Tool result: 14:05" in rp.text


def test_no_tools_renders_exactly_as_before():
    msgs = (ChatMessage("user", "Hi"),)
    assert render(msgs, "transcript", tools=()) == render(msgs, "transcript")


# -- stop strings and grammars -----------------------------------------------------------------------------
@pytest.mark.parametrize("choice,forced", [
    (None, False), (ToolChoice("auto"), False), (ToolChoice("none"), False), (ToolChoice("required"), True),
    (ToolChoice("function", "get_time"), True)])
def test_a_forced_call_gets_the_format_grammar(choice, forced):
    msgs = (ChatMessage("user", "Time in Paris?"),)
    rp = render(msgs, "transcript", tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
    assert "get_weather" in rp.text  # "none" still shows the tools
    # a forced call's grammar decides where it ends: no stop string cuts it (a string holding "Tool result:")
    assert rp.stop == (() if forced else ("\n\n", "\nUser:", "User:", "Tool result:"))
    expected = FORMATS["json"].grammar(TOOLS, choice, False) if forced else None
    assert rp.grammar == expected
    if choice is not None and choice.mode == "function":
        assert "get_time" in rp.grammar and "get_weather" not in rp.grammar


# -- GGUF templates -------------------------------------------------------------------------------------------
def test_a_template_that_renders_tools_gets_them_as_hf_passes_them():
    assert template_tool_caps(HERMES_TEMPLATE).tools and template_tool_caps(HERMES_TEMPLATE).calls
    assert template_tool_caps(HERMES_TEMPLATE).results
    assert tool_format("gguf", "qwen2", HERMES_TEMPLATE).name == "hermes"
    rp = render(CONVO, "gguf", chat_template=HERMES_TEMPLATE, tools=TOOLS, architecture="qwen2")
    assert rp.tool_format == "hermes" and "<tool_response>" in rp.stop
    assert "\n" + json.dumps(TOOLS[0].to_openai(), ensure_ascii=False) + "\n" in rp.text  # HF's tojson
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in rp.text  # an object, not a string
    assert ("<|im_start|>user\n<tool_response>\n{\"temp\": 18}\n</tool_response>\n<tool_response>\n14:05\n"
            "</tool_response><|im_end|>") in rp.text
    assert "Be brief.\n\n# Tools" in rp.text


def test_a_template_without_tools_is_polyfilled_with_the_format():
    caps = template_tool_caps(PLAIN_TEMPLATE, "<s>")
    assert not (caps.tools or caps.calls or caps.results)
    rp = render(CONVO, "gguf", chat_template=PLAIN_TEMPLATE, bos_token="<s>", tools=TOOLS, architecture="phi3")
    fmt = FORMATS["json"]
    assert rp.tool_format == "json" and not rp.add_bos
    assert rp.text.startswith("<s><|system|>" + fmt.system_prompt(TOOLS, "Be brief.") + "<|end|>")
    assert "<|assistant|>" + fmt.render_calls(CONVO[2].tool_calls) + "<|end|>" in rp.text
    assert '<|user|>Tool result: {"temp": 18}\nTool result: 14:05<|end|><|assistant|>' in rp.text


def test_mistral_template_gets_nine_character_ids():
    assert tool_format("gguf", "llama", MISTRAL_TEMPLATE).name == "mistral"
    convo = CONVO[1:] + (ChatMessage("user", "Thanks"),)
    rp = render(convo, "gguf", chat_template=MISTRAL_TEMPLATE, tools=TOOLS)
    assert '"id": "pqrstuvwx"}' in rp.text and '"call_id": "pqrstuvwx"}' in rp.text
    assert '"call_id": "kjihgfedc"}' in rp.text
    assert rp.text.endswith("[/TOOL_RESULTS][AVAILABLE_TOOLS] " + json.dumps([t.to_openai() for t in TOOLS])
                            + "[/AVAILABLE_TOOLS][INST] Thanks[/INST]")


def test_template_errors_stay_invalid_request():
    with pytest.raises(InvalidRequest) as ei:
        render(CONVO, "gguf", chat_template="{{ raise_exception('no tools here') }}", tools=TOOLS)
    assert ei.value.param == "messages"


# -- message checks ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("messages,param", [
    ((ChatMessage("user", "hi"), ChatMessage("tool", "x")), "messages[1].tool_call_id"),
    ((ChatMessage("user", "hi"), ChatMessage("tool", "x", tool_call_id="call_nope")), "messages[1].tool_call_id"),
    ((ChatMessage("tool", "x", tool_call_id=CALL.id), ChatMessage("assistant", "", (CALL,))),
     "messages[0].tool_call_id"),
    ((ChatMessage("user", "hi", (CALL,)),), "messages[0].tool_calls"),
    ((ChatMessage("robot", "hi"),), "messages[0].role"),
])
def test_bad_tool_messages_name_the_field(messages, param):
    with pytest.raises(InvalidRequest) as ei:
        GenerateRequest(messages=messages).validate()
    assert ei.value.param == param


def test_request_tool_checks():
    msgs = (ChatMessage("user", "hi"),)
    GenerateRequest(messages=CONVO, tools=TOOLS).validate()
    with pytest.raises(InvalidRequest) as ei:
        GenerateRequest(messages=msgs, tools=TOOLS, tool_choice=ToolChoice("required"),
                        decoding=DecodingParams(grammar='root ::= "{}"')).validate()
    assert ei.value.param == "tool_choice"
    with pytest.raises(InvalidRequest) as ei:
        GenerateRequest(messages=msgs, tools=TOOLS, tool_choice=ToolChoice("function", "nope")).validate()
    assert ei.value.param == "tool_choice"
    with pytest.raises(InvalidRequest) as ei:
        GenerateRequest(messages=msgs, tool_choice=ToolChoice("required")).validate()
    assert ei.value.param == "tool_choice"
    assert GenerateRequest(messages=msgs, tools=TOOLS).choice == ToolChoice("auto")
    assert GenerateRequest(messages=msgs).choice == ToolChoice("none")


# -- the reader of answers ---------------------------------------------------------------------------------------
ANSWER = 'Let me look. Tool call: {"name": "get_weather", "arguments": {"city": "Paris"}}'


def read(text: str, pieces: list[str], choice: ToolChoice | None = None, finish: str = "stop"):
    r = ToolStream(FORMATS["json"], TOOLS, choice)
    out = []
    for p in pieces:
        out += r.feed(p)
    more, outcome = r.finish(finish)
    return out, more, outcome


@pytest.mark.parametrize("cut", [None, 3, 14, 20, 40, 70])
def test_a_valid_call_comes_out_whole_after_the_text_in_any_pieces(cut):
    pieces = [ANSWER] if cut is None else [ANSWER[:cut], ANSWER[cut:]]
    early, late, outcome = read(ANSWER, pieces)
    assert all(isinstance(p, TextPiece) for p in early)
    assert "".join(p.text for p in early + late if isinstance(p, TextPiece)) == "Let me look."
    assert [type(p) for p in late if not isinstance(p, TextPiece)][0] is CallStart
    start = next(p for p in late if isinstance(p, CallStart))
    args = "".join(p.text for p in late if isinstance(p, ArgsPiece))
    end = next(p for p in late if isinstance(p, CallEnd))
    assert (start.name, args) == ("get_weather", '{"city": "Paris"}') and end.call == outcome.calls[0]
    assert outcome.text == "Let me look." and outcome.finish_reason == "tool_calls" and not outcome.errors


@pytest.mark.parametrize("bad,why", [
    ('Tool call: {"name": "get_weather", "arguments": {"town": "Paris"}}', "'city' is a required property"),
    ('Tool call: {"name": "fly", "arguments": {}}', "not one of the tools"),
    ('Tool call: {"name": "get_weather", "arguments": {"city": "Par', "ended inside"),
])
def test_an_invalid_call_leaves_the_raw_text_and_says_why(bad, why):
    text = "Sure. " + bad
    early, late, outcome = read(text, [text[:9], text[9:]], finish="length" if "Par" == bad[-3:] else "stop")
    assert "".join(p.text for p in early + late) == text == outcome.text
    assert not any(isinstance(p, (CallStart, ArgsPiece, CallEnd)) for p in early + late)
    assert outcome.calls == () and why in outcome.error_message
    assert outcome.finish_reason in ("stop", "length")


def test_one_bad_call_among_good_ones_passes_none_on():
    text = ('Tool call: {"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            'Tool call: {"name": "get_time", "arguments": {"tz": 3}}')
    _, _, outcome = read(text, [text])
    assert outcome.calls == () and outcome.text == text and len(outcome.errors) == 1
    assert outcome.errors[0].name == "get_time"


def test_tool_choice_none_and_no_tools_pass_text_through():
    out, more, outcome = read(ANSWER, [ANSWER], ToolChoice("none"))
    assert out == [TextPiece(ANSWER)] and more == [] and outcome.text == ANSWER and outcome.calls == ()
    r = ToolStream(FORMATS["json"], ())
    assert r.feed(ANSWER) == [TextPiece(ANSWER)] and not r.parsing


def test_stream_tools_wraps_an_engine_stream():
    done = Done("stop", Metrics(), ANSWER)
    events = [Delta(ANSWER[:20]), Delta(""), Delta(ANSWER[20:]), done]
    out = list(stream_tools(events, ToolStream(FORMATS["json"], TOOLS)))
    assert isinstance(out[-1], ToolsDone) and out[-1].done is done
    assert out[-1].outcome.finish_reason == "tool_calls" and out[-1].outcome.calls[0].name == "get_weather"
    assert isinstance(out[0], TextPiece)


def test_repeated_calls_and_a_last_call_cut_by_max_tokens_are_dropped():
    """What the bundled model does under a forced parallel grammar: the same call again and again until
    max_tokens cuts the last one. The whole calls are passed on once each, renumbered from 0."""
    one = 'Tool call: {"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    two = 'Tool call: {"name": "get_time", "arguments": {"tz": "UTC"}}\n'
    text = one + one.replace('"city"', ' "city"') + two + 'Tool call: {"name": "get_weather", "argu'
    _, late, outcome = read(text, [text], ToolChoice("required"), finish="length")
    assert [c.name for c in outcome.calls] == ["get_weather", "get_time"] and not outcome.errors
    assert outcome.finish_reason == "tool_calls"
    starts = [p for p in late if isinstance(p, CallStart)]
    assert [p.index for p in starts] == [0, 1]
    assert sorted({p.index for p in late if isinstance(p, ArgsPiece)}) == [0, 1]
    # cut off while it stopped by itself ("stop"): a broken call, nothing passed on
    _, _, stopped = read(text, [text], ToolChoice("required"), finish="stop")
    assert stopped.calls == () and stopped.errors
