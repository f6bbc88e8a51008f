"""Pure logic of the engine: parameter validation, templates, stop/UTF-8 streaming."""

from __future__ import annotations

import pickle

import pytest

from app.engine.chat.templates import choose_template_name, render
from app.engine.local.textstream import StopStreamer
from app.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound
from app.protocol.types import ChatMessage, DecodingParams, GenerateRequest, LoadSettings


@pytest.mark.parametrize("kw,param", [
    ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"min_p": 2}, "min_p"), ({"top_k": -3}, "top_k"), ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -5}, "max_tokens"), ({"seed": -1}, "seed"), ({"stop": [""]}, "stop"),
    ({"temperature": float("nan")}, "temperature"), ({"presence_penalty": 3}, "presence_penalty"),
    ({"logit_bias": {"x": 1}}, "logit_bias"), ({"typical_p": 0}, "typical_p"),
])
def test_bad_decoding_values_name_the_parameter(kw, param):
    with pytest.raises(InvalidRequest) as ei:
        DecodingParams.make(**kw)
    assert ei.value.param == param
    assert param in str(ei.value)


def test_load_settings_quantized_v_needs_flash_attention():
    with pytest.raises(InvalidRequest, match="flash"):
        LoadSettings(type_v="q8_0", flash_attn=False).validate()
    LoadSettings(type_v="q4_0", type_k="q4_0", flash_attn=True).validate()
    with pytest.raises(InvalidRequest, match="type_k"):
        LoadSettings(type_k="q5_1").validate()


def test_errors_are_picklable_with_fields():
    e = pickle.loads(pickle.dumps(ContextLengthExceeded(5000, 512, 16)))
    assert (e.prompt_tokens, e.n_ctx) == (5000, 512) and "5000" in str(e)
    e = pickle.loads(pickle.dumps(InvalidRequest("bad", param="top_p")))
    assert e.param == "top_p"
    e = pickle.loads(pickle.dumps(ModelNotFound("x", ["a", "b"])))
    assert e.available == ["a", "b"]


def test_request_validation():
    with pytest.raises(InvalidRequest):
        GenerateRequest().validate()
    with pytest.raises(InvalidRequest, match="empty"):
        GenerateRequest(messages=()).validate()
    with pytest.raises(InvalidRequest, match="role"):
        GenerateRequest(messages=(ChatMessage("robot", "hi"),)).validate()


class _Info:
    def __init__(self, **kw):
        self.chat_template = kw.get("chat_template")
        self.architecture = kw.get("architecture", "llama")
        self.name = kw.get("name", "")
        self.file_name = kw.get("file_name", "")


def test_template_choice():
    assert choose_template_name(_Info(chat_template="{{x}}")) == "gguf"
    assert choose_template_name(_Info(architecture="gemma3", name="Gemma 3 270m")) == "transcript"
    assert choose_template_name(_Info(architecture="gemma3", file_name="gemma-3-1b-it-Q4_K_M.gguf")) == "gemma"
    assert choose_template_name(_Info(architecture="llama", name="Meta Llama-3 8B Instruct")) == "llama-3"
    assert choose_template_name(_Info(architecture="qwen2", name="Qwen2.5 1.5B Instruct")) == "chatml"


def test_gemma_merges_system_into_first_user_turn():
    msgs = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    rp = render(msgs, "gemma")
    assert "system" not in rp.text
    assert rp.text.startswith("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n")
    assert rp.text.endswith("<start_of_turn>model\n")


def test_transcript_and_gguf_templates():
    rp = render([ChatMessage("user", "What is the capital of France?")], "transcript")
    assert rp.text.endswith("User: What is the capital of France?\nAssistant:")
    assert "\nUser:" in rp.stop
    tpl = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    rp = render([ChatMessage("user", "x")], "gguf", chat_template=tpl, bos_token="<s>")
    assert rp.text == "<s><user>x<assistant>" and rp.add_bos is False
    bad = "{% if true %}{{ raise_exception('no system role') }}{% endif %}"
    with pytest.raises(InvalidRequest, match="no system role"):
        render([ChatMessage("user", "x")], "gguf", chat_template=bad)
    with pytest.raises(InvalidRequest):
        render([ChatMessage("user", "x")], "gguf", chat_template="{% for %}")


def _stream(pieces, stop):
    s = StopStreamer(stop)
    out = []
    for p in pieces:
        t, st = s.feed(p)
        out.append(t)
        if st:
            break
    else:
        out.append(s.flush())
    return out, s.text


def test_stop_string_across_tokens_never_partly_emitted():
    out, text = _stream([b"ABC", b" D", b"EF", b"GHI", b"J and more"], ["DEFGHIJ"])
    assert text == "ABC "
    assert "".join(out) == text
    assert not any("D" in o for o in out)


def test_held_prefix_released_when_not_a_stop():
    out, text = _stream([b"ABC DE", b"X end"], ["DEFGHIJ"])
    assert text == "ABC DEX end" and "".join(out) == text


def test_earliest_stop_wins():
    _, text = _stream([b" Paris.\n\nUser: next"], ["\nUser:", "\n\nUser:"])
    assert text == " Paris."


def test_utf8_never_split():
    s = "👍🏽 🇯🇵 👨‍👩‍👧 歪 ß".encode()
    out, text = _stream([s[i:i + 1] for i in range(len(s))], [])
    assert text.encode() == s
    assert all("\ufffd" not in o for o in out)


def test_the_streamer_names_the_stop_string_that_ended_the_answer():
    from app.engine.local.textstream import StopStreamer

    s = StopStreamer(("END", "ND", "\nUser:"))
    assert s.feed(b"abc E")[0] == "abc " and s.matched is None
    out, stopped = s.feed(b"ND more")
    assert stopped and out == "" and s.text == "abc " and s.matched == "END"  # "ND" begins later
    plain = StopStreamer(("x",))
    plain.feed(b"no stop here")
    assert plain.flush() == "" and plain.matched is None
