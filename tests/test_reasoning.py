"""Thinking and budgets, pure logic (issue 14): markers per model, the streaming splitter, budgets and their
precedence, the prompt plan, budget forcing and its metrics.

Every recorded-style output is also fed in two pieces split at every position and one character at a time:
the pieces must add up to the one-shot split, and no marker (nor a part of one) may reach either output.
Clocks are plain numbers: the forcer never reads a clock itself.
"""

from __future__ import annotations

import math

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.engine.chat.reasoning_budget import BudgetForcer, PromptPlan, ReasoningMetrics, plan_prompt, render_kwargs
from app.engine.chat.thinking import (
    COMMAND_R7B,
    DEFAULT_MARKERS,
    HARMONY,
    MISTRAL_THINK,
    THINK,
    AnswerPiece,
    ReasoningPiece,
    ReasoningSplitter,
    SplitOutput,
    ThinkingMarkers,
    markers_for,
    split_reasoning,
)
from app.errors import InvalidRequest
from app.protocol.reasoning import EFFORT_TOKENS, ReasoningBudget, ReasoningSettings, resolve_budget

# Template fragments written the way each family's template does it (the decisive parts only).
QWEN3_LIKE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and '</think>' in m.content %}{{ m.content.split('</think>')[-1].lstrip('\\n') }}"
    "{%- else %}{{ m.content }}{%- endif %}{{ '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}")
R1_LIKE = ("{%- for m in messages %}{%- if m.role == 'user' %}{{ '<｜User｜>' + m.content }}{%- else %}"
           "{%- set c = m.content %}{%- if '</think>' in c %}{%- set c = c.split('</think>')[-1] %}{%- endif %}"
           "{{ '<｜Assistant｜>' + c + '<｜end▁of▁sentence｜>' }}{%- endif %}{%- endfor %}"
           "{%- if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{%- endif %}")
GPT_OSS_LIKE = ("{{- '<|start|>system<|message|>' }}{%- if reasoning_effort is not defined %}"
                "{%- set reasoning_effort = 'medium' %}{%- endif %}{{- 'Reasoning: ' + reasoning_effort + '\\n\\n' }}"
                "{{- '# Valid channels: analysis, commentary, final. Channel must be included for every message.' }}"
                "{{- '<|end|>' }}{%- for m in messages %}{%- if m.role == 'assistant' %}"
                "{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' }}{%- else %}"
                "{{- '<|start|>' + m.role + '<|message|>' + m.content + '<|end|>' }}{%- endif %}{%- endfor %}"
                "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}")


def render(template: str, **kw) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=[{"role": "user", "content": "What is 2+2?"}],
                                            add_generation_prompt=True, **kw)


# name: (markers, started_inside, output, reasoning, answer, unclosed)
RECORDED = {
    "qwen3": (THINK, False, "<think>\nOkay, the user asks for 2+2. That is 4.\n</think>\n\n2 + 2 = **4**.",
              "Okay, the user asks for 2+2. That is 4.", "2 + 2 = **4**.", False),
    "deepseek-r1": (THINK, True, "Okay, so I need to add 2 and 2.\n\nThat gives 4.\n</think>\n\nThe answer is 4.",
                    "Okay, so I need to add 2 and 2.\n\nThat gives 4.", "The answer is 4.", False),
    "qwq": (THINK, True, "\nAlright, 3 * 4 = 12.\n</think>\n\n**12**", "Alright, 3 * 4 = 12.", "**12**", False),
    "qwen3-no-think": (THINK, False, "2 + 2 = 4.", "", "2 + 2 = 4.", False),
    "gpt-oss": (HARMONY, False,
                "<|channel|>analysis<|message|>User asks: sum 1 to 100. That's 5050.<|end|><|start|>assistant"
                "<|channel|>final<|message|>The sum is 5050.<|return|>",
                "User asks: sum 1 to 100. That's 5050.", "The sum is 5050.", False),
    "gpt-oss-two-analysis": (HARMONY, False,
                             "<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>analysis"
                             "<|message|>Second.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
                             "First.\n\nSecond.", "Done.", False),
    "gpt-oss-final-only": (HARMONY, False, "<|channel|>final<|message|>Hi there.<|return|>", "", "Hi there.",
                           False),
    "magistral": (MISTRAL_THINK, False, "[THINK]Let me check: 3*4=12.[/THINK]3 × 4 = 12.",
                  "Let me check: 3*4=12.", "3 × 4 = 12.", False),
    "command-r7b": (COMMAND_R7B, False,
                    "<|START_THINKING|>Plan: greet back.<|END_THINKING|><|START_RESPONSE|>Hello!<|END_RESPONSE|>",
                    "Plan: greet back.", "Hello!", False),
    "base-prefilled": (DEFAULT_MARKERS, True, " 2 plus 2 makes 4. </think> 4", "2 plus 2 makes 4.", "4", False),
    "unclosed": (THINK, False, "<think>\nI keep going and going \n", "I keep going and going", "", True),
    "plain": (DEFAULT_MARKERS, False, "  Paris.\n", "", "  Paris.\n", False),
    "decoy": (THINK, False, "Use <thinking> tags, or <think", "", "Use <thinking> tags, or <think", False),
    "whitespace-before-think": (THINK, False, "\n\n<think>\nhmm\n</think>\n\nOK", "hmm", "OK", False),
    "stray-end-first": (THINK, False, "</think>\n\nAnswer", "", "Answer", False),
    "empty-thinking": (THINK, False, "<think>\n\n</think>\n\nJust this.", "", "Just this.", False),
    "unicode": (THINK, True, "Über 🙂 denken\n</think>\n\n答え: 4", "Über 🙂 denken", "答え: 4", False),
}


def run(markers: ThinkingMarkers, started_inside: bool, chunks: list[str]) -> tuple[list, SplitOutput]:
    s = ReasoningSplitter(markers, started_inside)
    pieces = []
    for c in chunks:
        pieces += s.feed(c)
    pieces += s.finish()
    return pieces, s.result()


def joined(pieces: list, kind: type) -> str:
    return "".join(p.text for p in pieces if isinstance(p, kind))


def check_clean(markers: ThinkingMarkers, pieces: list) -> None:
    for p in pieces:
        assert p.text, "a piece is never empty"
        for m in markers.strings:
            assert m not in p.text, (m, p)


# -- the splitter ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(RECORDED))
def test_recorded_outputs_split(name):
    markers, inside, text, reasoning, answer, unclosed = RECORDED[name]
    assert split_reasoning(text, markers, inside) == SplitOutput(reasoning, answer, unclosed)
    pieces, out = run(markers, inside, [text])
    assert (joined(pieces, ReasoningPiece), joined(pieces, AnswerPiece)) == (reasoning, answer)
    check_clean(markers, pieces)


@pytest.mark.parametrize("name", list(RECORDED))
def test_every_split_position_gives_the_same_split(name):
    markers, inside, text, reasoning, answer, unclosed = RECORDED[name]
    expected = SplitOutput(reasoning, answer, unclosed)
    for i in range(len(text) + 1):
        pieces, out = run(markers, inside, [text[:i], text[i:]])
        assert out == expected, i
        assert (joined(pieces, ReasoningPiece), joined(pieces, AnswerPiece)) == (reasoning, answer), i
        check_clean(markers, pieces)
    pieces, out = run(markers, inside, list(text))
    assert out == expected
    check_clean(markers, pieces)


def test_partial_marker_is_held_back_until_decided():
    s = ReasoningSplitter(THINK)
    assert s.feed("Hello <thi") == [AnswerPiece("Hello ")]
    assert s.feed("n") == []
    assert s.feed("king> about it") == [AnswerPiece("<thinking> about it")]
    assert s.feed(" <think") == [AnswerPiece(" ")]
    assert s.feed(">") == [] and s.inside
    assert s.feed("deep thought</th") == [ReasoningPiece("deep thought")]
    assert s.feed("ink>\n") == [] and not s.inside and s.closed
    assert s.feed("\nDone.") == [AnswerPiece("Done.")]
    assert s.finish() == [] and not s.unclosed


def test_harmony_control_text_never_leaks_and_pieces_alternate():
    text = RECORDED["gpt-oss"][2]
    s = ReasoningSplitter(HARMONY)
    for i in range(0, len(text), 3):
        out = s.feed(text[i:i + 3])
        assert all(type(a) is not type(b) for a, b in zip(out, out[1:]))
        assert not any("<|" in p.text or "|>" in p.text for p in out)
    s.finish()
    assert s.result() == SplitOutput("User asks: sum 1 to 100. That's 5050.", "The sum is 5050.")


def test_model_that_never_closes_thinking():
    s = ReasoningSplitter(DEFAULT_MARKERS, started_inside=True)
    assert s.feed(" Let me think") == [ReasoningPiece("Let me think")]
    assert s.feed(" about this </thi") == [ReasoningPiece(" about this")]
    assert not s.unclosed  # only known at the end
    assert s.finish() == [ReasoningPiece(" </thi")]
    assert s.unclosed and s.answer == ""
    with pytest.raises(RuntimeError):
        s.feed("more")


def test_only_the_whitespace_right_after_the_end_marker_is_trimmed():
    out = split_reasoning("<think>a</think>\n\n  x\n\ny  ", THINK)
    assert out == SplitOutput("a", "x\n\ny  ")


def test_splitter_with_a_nested_start_and_a_longer_marker_sharing_a_prefix():
    m = ThinkingMarkers("<t>", "</t>", drop=("<t>x",))
    for text, expect in (("<t>a<t>b</t>c", SplitOutput("ab", "c")), ("q<t>xr", SplitOutput("", "qr"))):
        for i in range(len(text) + 1):
            assert run(m, False, [text[:i], text[i:]])[1] == expect, (text, i)


# -- markers per model ----------------------------------------------------------------------------------------
def test_markers_for_each_family():
    qwen3 = markers_for("gguf", QWEN3_LIKE, "qwen3")
    assert (qwen3.start, qwen3.end, qwen3.family, qwen3.switch) == ("<think>", "</think>", "think", "enable_thinking")
    assert qwen3.native and not qwen3.prefill_start
    assert markers_for("chatml", QWEN3_LIKE, "qwen3").switch is None  # a built-in template has no switch
    r1 = markers_for("gguf", R1_LIKE, "qwen2")
    assert (r1.family, r1.switch) == ("think", None)
    oss = markers_for("gguf", GPT_OSS_LIKE, "gpt-oss")
    assert (oss.start, oss.end, oss.family, oss.effort_var) == (HARMONY.start, "<|end|>", "harmony",
                                                               "reasoning_effort")
    assert markers_for("chatml", None, "gpt-oss").family == "harmony"
    assert markers_for("gguf", "{{ '[THINK]' }}", "llama").family == "mistral"
    assert markers_for("gguf", "<|START_THINKING|>", "cohere2").family == "command-r7b"
    assert markers_for("chatml", None, "qwen3").family == "think"


def test_base_model_without_template_gets_the_prefilled_default():
    m = markers_for("transcript", None, "gemma3")
    assert (m.start, m.end, m.prefill_start, m.family) == ("<think>", "</think>", True, "prefill")
    assert markers_for("transcript", None, "qwen3").prefill_start  # a template-less qwen3 file is a base model
    assert markers_for("gemma", None, "gemma3").prefill_start
    assert all(m.source for m in (THINK, HARMONY, MISTRAL_THINK, COMMAND_R7B, DEFAULT_MARKERS))


def test_settings_override_the_markers():
    m = markers_for("gguf", QWEN3_LIKE, "qwen3", {"start": "<reason>", "end": "</reason>"})
    assert (m.start, m.end, m.close, m.family, m.switch) == ("<reason>", "</reason>", "</reason>", "custom",
                                                             "enable_thinking")
    m = markers_for("transcript", None, "gemma3", {"start": "[[", "end": "]]", "prefill_start": True,
                                                   "drop": ["<eot>"], "close": "]]\n"})
    assert m.prefill_start and m.drop == ("<eot>",) and m.force_text("Answer:") == "]]\nAnswer:"
    assert split_reasoning("[[a]]\nb<eot>", m) == SplitOutput("a", "b")
    assert markers_for("gguf", QWEN3_LIKE, "qwen3", {}).family == "think"  # empty: no override


@pytest.mark.parametrize("overrides, param", [
    ({"start": "<r>"}, "thinking_markers.end"),
    ({"end": "</r>"}, "thinking_markers.start"),
    ({"start": "", "end": "</r>"}, "thinking_markers.start"),
    ({"start": "<r>", "end": "  "}, "thinking_markers.end"),
    ({"start": "<r>", "end": "<r>"}, "thinking_markers.end"),
    ({"start": "<r>", "end": "</r>", "colour": "red"}, "thinking_markers.colour"),
    ({"start": "<r>", "end": "</r>", "close": "done"}, "thinking_markers.close"),
    ({"start": "<r>", "end": "</r>", "drop": ["", "x"]}, "thinking_markers.drop"),
    ({"start": "<r>", "end": "</r>", "prefill_start": "yes"}, "thinking_markers.prefill_start"),
    ({"start": 3, "end": "</r>"}, "thinking_markers.start"),
    (["<r>", "</r>"], "thinking_markers"),
])
def test_bad_marker_overrides_name_the_field(overrides, param):
    with pytest.raises(InvalidRequest) as e:
        markers_for("gguf", None, "llama", overrides)
    assert e.value.param == param


def test_inside_after_reads_the_rendered_prompt():
    assert THINK.inside_after(render(R1_LIKE))
    assert not THINK.inside_after(render(QWEN3_LIKE))
    assert not THINK.inside_after(render(QWEN3_LIKE, enable_thinking=False))
    assert THINK.inside_after(render(QWEN3_LIKE) + "<think>\nLet me")  # a client's prefilled assistant turn
    assert not HARMONY.inside_after(render(GPT_OSS_LIKE))
    assert HARMONY.inside_after(render(GPT_OSS_LIKE) + HARMONY.start)


# -- budgets --------------------------------------------------------------------------------------------------
def test_effort_budgets():
    assert EFFORT_TOKENS == {"none": 0, "low": 256, "medium": 1024, "high": 4096}
    for effort, tokens in EFFORT_TOKENS.items():
        b = resolve_budget(effort)
        assert (b.tokens, b.effort, b.source, b.off) == (tokens, effort, "request", tokens == 0)


def test_budget_precedence_request_conversation_model():
    conv = {"reasoning_effort": "high", "reasoning_deadline_s": 30}
    model = ReasoningSettings("low", None, 5.0)
    assert resolve_budget(None, 32, None, conv, model) == ReasoningBudget(32, 30, None, "request", 32)
    assert resolve_budget("low", None, None, {"reasoning_budget": 2000}, model).tokens == 256
    b = resolve_budget(None, None, None, conv, model)
    assert (b.tokens, b.effort, b.source, b.deadline_s) == (4096, "high", "conversation", 30)
    b = resolve_budget(None, None, None, None, model)
    assert (b.tokens, b.source, b.deadline_s) == (256, "model", 5.0)
    assert resolve_budget(None, None, 2.5, None, model).deadline_s == 2.5
    b = resolve_budget()
    assert (b.tokens, b.source, b.asked, b.off) == (None, "none", False, False)
    assert resolve_budget(deadline_s=3).asked


def test_explicit_tokens_beat_an_effort_in_the_same_layer():
    b = resolve_budget("high", 100)
    assert (b.tokens, b.effort) == (100, None)
    assert resolve_budget(None, None, None, {"reasoning_effort": "none", "reasoning_budget": 64}).tokens == 64


def test_budget_fits_half_the_context_left():
    b = resolve_budget("high")
    assert b.fit(n_ctx=32768, prompt_tokens=100).tokens == 4096
    small = b.fit(n_ctx=512, prompt_tokens=100)
    assert (small.tokens, small.requested, small.capped) == (206, 4096, True)
    assert b.fit(n_ctx=32768, prompt_tokens=100, max_tokens=256).tokens == 128
    assert b.fit(n_ctx=100, prompt_tokens=120).tokens == 0  # nothing left: no thinking
    unset = resolve_budget().fit(4096, 96)
    assert (unset.tokens, unset.source, unset.asked) == (2000, "none", False)
    assert resolve_budget(None, 32).fit(4096, 96) == ReasoningBudget(32, None, None, "request", 32, False)


@pytest.mark.parametrize("kwargs, param", [
    ({"effort": "extreme"}, "reasoning_effort"),
    ({"effort": "HIGH"}, "reasoning_effort"),
    ({"budget_tokens": -1}, "hearth.reasoning_budget"),
    ({"budget_tokens": True}, "hearth.reasoning_budget"),
    ({"budget_tokens": 1.5}, "hearth.reasoning_budget"),
    ({"budget_tokens": "10"}, "hearth.reasoning_budget"),
    ({"budget_tokens": 1 << 21}, "hearth.reasoning_budget"),
    ({"deadline_s": 0}, "hearth.reasoning_deadline_s"),
    ({"deadline_s": -2.0}, "hearth.reasoning_deadline_s"),
    ({"deadline_s": math.nan}, "hearth.reasoning_deadline_s"),
    ({"deadline_s": math.inf}, "hearth.reasoning_deadline_s"),
    ({"deadline_s": True}, "hearth.reasoning_deadline_s"),
    ({"deadline_s": "5"}, "hearth.reasoning_deadline_s"),
    ({"per_conversation": {"reasoning_effort": "max"}}, "reasoning_effort"),
    ({"per_conversation": {"reasoning_budget": -5}}, "hearth.reasoning_budget"),
    ({"per_model_default": {"reasoning_deadline_s": 0}}, "hearth.reasoning_deadline_s"),
    ({"per_model_default": ReasoningSettings(budget_tokens=-1)}, "hearth.reasoning_budget"),
    ({"per_conversation": {"budget": 5}}, "budget"),
])
def test_bad_budget_inputs_name_the_param(kwargs, param):
    with pytest.raises(InvalidRequest) as e:
        resolve_budget(**kwargs)
    assert e.value.param == param
    if "per_" in next(iter(kwargs)) and param != "budget":
        assert "the conversation's" in str(e.value) or "the model's" in str(e.value)


def test_bad_fit_inputs_name_the_param():
    for kwargs, param in (({"n_ctx": -1, "prompt_tokens": 0}, "n_ctx"), ({"n_ctx": 10, "prompt_tokens": 1.5},
                          "prompt_tokens"), ({"n_ctx": 10, "prompt_tokens": 1, "max_tokens": True}, "max_tokens")):
        with pytest.raises(InvalidRequest) as e:
            resolve_budget("low").fit(**kwargs)
        assert e.value.param == param


# -- the prompt plan ----------------------------------------------------------------------------------------
def test_qwen3_budget_zero_renders_with_the_switch_off():
    m = markers_for("gguf", QWEN3_LIKE, "qwen3")
    off = resolve_budget("none")
    kw = render_kwargs(m, off)
    assert kw == {"enable_thinking": False}
    prompt = render(QWEN3_LIKE, **kw)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert plan_prompt(m, prompt, off) == PromptPlan("", False, False)
    on = resolve_budget("medium")
    assert render_kwargs(m, on) == {}
    assert plan_prompt(m, render(QWEN3_LIKE), on) == PromptPlan("", False, True)  # it writes <think> itself


def test_deepseek_r1_starts_inside_and_budget_zero_closes_it():
    m = markers_for("gguf", R1_LIKE, "qwen2")
    prompt = render(R1_LIKE, **render_kwargs(m, resolve_budget("none")))
    assert prompt.endswith("<｜Assistant｜><think>\n")
    assert plan_prompt(m, prompt, resolve_budget("none")) == PromptPlan("\n</think>\n\n", False, False)
    assert plan_prompt(m, prompt, resolve_budget("low")) == PromptPlan("", True, True)
    assert plan_prompt(m, prompt, resolve_budget()) == PromptPlan("", True, True)


def test_native_thinker_without_a_switch_gets_an_empty_block():
    m = markers_for("chatml", QWEN3_LIKE, "qwen3")
    plan = plan_prompt(m, "<|im_start|>assistant\n", resolve_budget(None, 0))
    assert plan == PromptPlan("<think>\n</think>\n\n", False, False)
    assert not m.inside_after("<|im_start|>assistant\n" + plan.suffix)


def test_base_model_thinks_only_when_a_budget_asks():
    m = markers_for("transcript", None, "gemma3")
    prompt = "User: What is 2+2?\nAssistant:"
    assert plan_prompt(m, prompt, resolve_budget()) == PromptPlan("", False, False)
    assert plan_prompt(m, prompt, resolve_budget(None, 32)) == PromptPlan("<think>\n", True, True)
    assert plan_prompt(m, prompt, resolve_budget(deadline_s=2)) == PromptPlan("<think>\n", True, True)
    assert plan_prompt(m, prompt, resolve_budget("none")) == PromptPlan("", False, False)
    assert render_kwargs(m, resolve_budget("none")) == {}


def test_gpt_oss_effort_goes_to_the_template_and_none_leaves_analysis_empty():
    m = markers_for("gguf", GPT_OSS_LIKE, "gpt-oss")
    assert render_kwargs(m, resolve_budget("high")) == {"reasoning_effort": "high"}
    assert render_kwargs(m, resolve_budget(None, 500)) == {}
    off = resolve_budget("none")
    assert render_kwargs(m, off) == {"reasoning_effort": "low"}
    prompt = render(GPT_OSS_LIKE, **render_kwargs(m, off))
    assert "Reasoning: low" in prompt
    plan = plan_prompt(m, prompt, off)
    assert plan == PromptPlan(HARMONY.start + HARMONY.close, False, False)
    assert not m.inside_after(prompt + plan.suffix)


# -- budget forcing -------------------------------------------------------------------------------------------
def feed(forcer: BudgetForcer, tokens: list[str], t: float = 1.0, dt: float = 1.0) -> list:
    steps = []
    for tok in tokens:
        steps.append(forcer.step(tok, t))
        t += dt
    return steps


@pytest.mark.parametrize("n", [1, 2, 7, 32])
def test_forcing_at_exactly_n_thinking_tokens(n):
    f = BudgetForcer(DEFAULT_MARKERS, n, started_inside=True, t0=0.0)
    steps = feed(f, [f" w{i}" for i in range(n + 3)])
    assert [s.insert for s in steps[:n - 1]] == [""] * (n - 1)
    assert (steps[n - 1].insert, steps[n - 1].reason) == ("\n</think>\n\n", "budget")
    assert all(s.insert == "" for s in steps[n:])
    m = f.metrics()
    assert (m.reasoning_tokens, m.answer_tokens, m.forced, m.stopped_by) == (n, 3, True, "budget")
    assert m.ttfat_s == n + 1.0  # the first token after the forced end, at t = n + 1
    f.finish()
    out = f.splitter.result()
    assert out.reasoning == " ".join(f"w{i}" for i in range(n))
    assert out.answer == f"w{n} w{n + 1} w{n + 2}"


def test_the_opening_marker_is_not_thinking_and_a_natural_close_is_not_forced():
    f = BudgetForcer(THINK, 3, t0=0.0)
    steps = feed(f, ["<think>", "\n", "a", "</think>", "\n\n", "Hi", "!"])
    assert all(s.insert == "" for s in steps)
    m = f.metrics()
    assert (m.reasoning_tokens, m.answer_tokens, m.forced, m.stopped_by) == (4, 3, False, None)
    assert (m.ttfat_s, m.thinking_s) == (6.0, 3.0)  # "Hi" at t=6; thinking from t=1 to its close at t=4
    assert f.splitter.result() == SplitOutput("a", "Hi!")


def test_a_token_that_closes_thinking_at_the_budget_is_not_forced():
    f = BudgetForcer(THINK, 2, started_inside=True)
    steps = feed(f, ["a", "b", "</think>", "ok"])
    assert [s.insert for s in steps] == ["", "\n</think>\n\n", "", ""]  # forced at b: "</think>" came too late
    f = BudgetForcer(THINK, 2, started_inside=True)
    steps = feed(f, ["a", "b</think>", "ok"])
    assert [s.insert for s in steps] == ["", "", ""] and not f.forced


def test_budget_zero_on_a_native_thinker_closes_at_the_opening_token():
    f = BudgetForcer(THINK, 0, answer_now="Final answer:")
    steps = feed(f, ["<think>", " 4"])
    assert (steps[0].insert, steps[0].reason) == ("\n</think>\n\nFinal answer:", "budget")
    assert steps[0].pieces == (AnswerPiece("Final answer:"),)
    assert f.splitter.result().reasoning == "" and f.metrics().reasoning_tokens == 1


def test_stop_thinking_mid_stream():
    f = BudgetForcer(THINK, None, started_inside=True, t0=0.0)
    steps = feed(f, ["Hmm", ",", " let"])
    assert all(s.insert == "" for s in steps)
    assert f.stop_thinking() is True
    s = f.step(" me", 4.0)
    assert (s.insert, s.reason, s.pieces) == ("\n</think>\n\n", "user", (ReasoningPiece(" me"),))
    assert f.stop_thinking() is False  # thinking already ended
    feed(f, ["Yes", "."], t=5.0)
    f.finish()
    m = f.metrics()
    assert (m.forced, m.stopped_by, m.reasoning_tokens, m.answer_tokens, m.ttfat_s) == (True, "user", 4, 2, 5.0)
    assert f.splitter.result() == SplitOutput("Hmm, let me", "Yes.")


def test_stop_before_thinking_opens_closes_it_as_it_opens():
    f = BudgetForcer(THINK, 1000)
    assert f.stop_thinking()
    s = f.step("<think>", 1.0)
    assert s.reason == "user" and not f.thinking
    f.step("<think>", 2.0)  # thinking reopened after a forced end is closed again
    assert not f.thinking and f.metrics().stopped_by == "user"


def test_deadline_from_the_request_start():
    f = BudgetForcer(DEFAULT_MARKERS, None, 2.0, started_inside=True, t0=100.0)
    steps = [f.step(tok, t) for tok, t in (("a", 100.5), (" b", 101.0), (" c", 102.0), (" d", 102.5))]
    assert [s.reason for s in steps] == [None, None, "deadline", None]
    assert f.metrics().stopped_by == "deadline"


def test_ttfat_is_the_first_sampled_answer_token_not_the_inserted_line():
    f = BudgetForcer(THINK, 1, answer_now="Final answer:", started_inside=True, t0=10.0)
    s = f.step("2+2", 11.0)
    assert s.insert.endswith("Final answer:") and AnswerPiece("Final answer:") in s.pieces
    assert f.metrics().ttfat_s is None
    f.step(" 4", 11.5)
    f.finish()
    assert f.metrics().ttfat_s == 1.5
    assert f.splitter.result() == SplitOutput("2+2", "Final answer: 4")


def test_harmony_forcing_inserts_the_final_channel():
    f = BudgetForcer(HARMONY, 2)
    steps = feed(f, ["<|channel|>", "analysis", "<|message|>", "We", " need"])
    assert [s.reason for s in steps] == [None] * 4 + ["budget"]
    assert steps[-1].insert == "<|end|><|start|>assistant<|channel|>final<|message|>"
    feed(f, ["Answer", ".", "<|return|>"], t=10.0)
    f.finish()
    assert f.splitter.result() == SplitOutput("We need", "Answer.")
    m = f.metrics()  # the three tokens that wrote the start marker are thinking, not answer
    assert (m.reasoning_tokens, m.answer_tokens, m.ttfat_s) == (5, 3, 10.0)


def test_thinking_reopened_after_a_budget_force_is_closed_again():
    f = BudgetForcer(THINK, 1)
    steps = feed(f, ["<think>", "a", "Ans", "<think>", "b"])
    assert [s.reason for s in steps] == [None, "budget", None, "budget", None]
    assert f.splitter.result().reasoning == "a"


def test_model_that_never_closes_thinking_reports_unclosed():
    f = BudgetForcer(THINK, None, started_inside=True, t0=0.0)
    feed(f, ["a", " b", " c"], t=1.0)
    assert f.finish() == [] and f.metrics() == ReasoningMetrics(3, 0, None, 2.0, False, None, True)
    with pytest.raises(RuntimeError):
        f.step("d", 5.0)
    assert f.stop_thinking() is False


def test_counts_add_up_over_every_recorded_output_token_by_token():
    for name, (markers, inside, text, reasoning, answer, _) in RECORDED.items():
        f = BudgetForcer(markers, None, started_inside=inside)
        pieces = []
        for i, ch in enumerate(text):
            pieces += f.step(ch, float(i)).pieces
        pieces += f.finish()
        m = f.metrics()
        assert m.reasoning_tokens + m.answer_tokens == len(text), name
        assert (joined(pieces, ReasoningPiece), joined(pieces, AnswerPiece)) == (reasoning, answer), name


def test_metrics_to_dict_and_bad_forcer_inputs():
    assert ReasoningMetrics(5, 3, 1.25, 0.5, True, "budget").to_dict() == {
        "reasoning_tokens": 5, "answer_tokens": 3, "ttfat_s": 1.25, "thinking_s": 0.5, "forced": True,
        "stopped_by": "budget", "unclosed": False}
    for kwargs, param in (({"budget_tokens": -1}, "hearth.reasoning_budget"),
                          ({"deadline_s": 0.0}, "hearth.reasoning_deadline_s"),
                          ({"answer_now": 3}, "answer_now")):
        with pytest.raises(InvalidRequest) as e:
            BudgetForcer(THINK, **kwargs)
        assert e.value.param == param
