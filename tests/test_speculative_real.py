"""Speculative decoding on the real bundled model (app/engine/local/runtime.py, docs/speculative.md): greedy text
identical with and without prompt lookup and a draft model on copy-heavy prompts, acceptance reported, the
default (adaptive prompt lookup) token for token the plain answer on a quoting and a free prompt, a sampled
run's histogram consistent with plain sampling, and requests that cannot speculate saying why."""

from __future__ import annotations

import numpy as np
import pytest
from engine_runs import ids_and_done

from app.engine.local.engine import Engine
from app.engine.local.speculative import chi_square_sf, chi_square_two_sample
from app.protocol.types import DecodingParams, Delta, GenerateRequest, LoadSettings
from benchmarks.speculative_bench import free_items, items, quote_items

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def engine(bundled_model):
    eng = Engine(bundled_model, LoadSettings(n_ctx=2048, n_parallel=1), draft_model=bundled_model)
    eng.load()
    yield eng
    eng.close()


def greedy(prompt: str, mode: str | None, n: int = 80, stop: tuple[str, ...] = ("```",)) -> GenerateRequest:
    return GenerateRequest(prompt=prompt, speculative=mode,
                           decoding=DecodingParams.make(temperature=0.0, max_tokens=n, stop=list(stop)))


@pytest.mark.parametrize("mode", ["prompt_lookup", "draft"])
def test_greedy_text_identical_on_copy_heavy_prompts(engine, mode):
    for _label, prompt in items(2):
        plain = engine.complete(greedy(prompt, "off"))
        fast = engine.complete(greedy(prompt, mode))
        assert fast.text == plain.text
        assert fast.metrics.completion_tokens == plain.metrics.completion_tokens
        m = fast.metrics
        assert m.spec_mode == mode and m.spec_steps > 0 and m.spec_drafted > 0
        assert m.acceptance_rate > 0.5  # the answer copies the prompt; a self-draft agrees with itself
        assert m.spec_steps < m.completion_tokens  # more than one token per step on average
        assert plain.metrics.spec_mode is None and plain.metrics.spec_drafted == 0


def test_a_request_that_cannot_speculate_says_why(engine):
    prompt = items(1)[0][1]
    d = engine.complete(GenerateRequest(prompt=prompt, speculative="prompt_lookup", want_logprobs=2,
                                        decoding=DecodingParams.make(temperature=0.0, max_tokens=3)))
    assert d.metrics.spec_mode is None and "logprobs" in d.info["speculative"]
    d = engine.complete(GenerateRequest(prompt=prompt, speculative="draft", decoding=DecodingParams.make(
        temperature=0.0, max_tokens=3, grammar='root ::= "def" [a-z ]*')))
    assert d.metrics.spec_mode is None and "grammar" in d.info["speculative"]


def test_stop_strings_and_max_tokens_end_inside_a_step(engine):
    """Accepted guesses past the end of the answer are discarded: same text, same length as plain."""
    prompt = items(1)[0][1]
    for n in (1, 2, 7):
        plain = engine.complete(greedy(prompt, "off", n))
        fast = engine.complete(greedy(prompt, "prompt_lookup", n))
        assert (fast.text, fast.finish_reason, fast.metrics.completion_tokens) == \
            (plain.text, plain.finish_reason, plain.metrics.completion_tokens)
    stop = GenerateRequest(prompt=prompt, speculative="prompt_lookup",
                           decoding=DecodingParams.make(temperature=0.0, max_tokens=80, stop=["count"]))
    plain = engine.complete(GenerateRequest(prompt=prompt, speculative="off", decoding=stop.decoding))
    fast = engine.complete(stop)
    assert fast.text == plain.text and fast.finish_reason == "stop"
    # the slot's KV was cut back to what it holds: the next greedy run is still the plain one
    assert engine.complete(greedy(prompt, "off")).text == engine.complete(greedy(prompt, "prompt_lookup")).text


_ids = ids_and_done


@pytest.mark.parametrize("which", ["quote", "free"])
def test_the_default_is_the_plain_answer_token_for_token(engine, which):
    """No speculative setting anywhere: adaptive prompt lookup. Greedy, its tokens are those of "off"; on an
    answer that quotes its prompt (a bug fix copying the code) it speculated and kept guesses."""
    item = quote_items()[4] if which == "quote" else free_items()[0]
    n = item.max_tokens or 120  # free text: before the base model starts repeating itself
    off_ids, off = _ids(engine, greedy(item.prompt, "off", n, item.stop))
    ids, done = _ids(engine, greedy(item.prompt, None, n, item.stop))
    assert ids == off_ids and done.text == off.text and done.finish_reason == off.finish_reason
    assert off.metrics.spec_mode is None and off.metrics.spec_drafted == 0
    m = done.metrics
    if which == "quote":
        assert m.spec_mode == "auto" and m.spec_steps > 0 and m.spec_accepted > m.completion_tokens // 4
        assert m.acceptance_rate > 0.5
    else:
        assert m.spec_drafted < m.completion_tokens // 4  # free text: few guesses, if any


LIST_PROMPT = ("Fruit list: apple, banana, cherry, plum, pear, fig, lime.\n"
               "The same fruit list again: apple, banana,")


def _pairs(engine: Engine, mode: str | None, seeds: range) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    drafted = 0
    for s in seeds:
        ids: list[int] = []
        for ev in engine.generate(GenerateRequest(prompt=LIST_PROMPT, speculative=mode, decoding=DecodingParams.make(
                temperature=1.5, top_k=4, top_p=1.0, min_p=0.0, seed=s, max_tokens=5))):
            if isinstance(ev, Delta):
                ids += ev.token_ids
            else:
                drafted += ev.metrics.spec_drafted
        # Tokens 3 and 4: the first answer token comes from the prefill's last chunk (never guessed), and the
        # default guesses only after a match came true once (token 2), then two at a time (tokens 3 and 4).
        key = tuple(ids[2:4])
        counts[key] = counts.get(key, 0) + 1
    if mode != "off":
        assert drafted > 0
    return counts


@pytest.fixture(scope="module")
def plain_pairs(engine):
    return _pairs(engine, "off", range(120))


@pytest.mark.parametrize("mode", ["prompt_lookup", None])
def test_sampled_histogram_consistent_with_plain_sampling(engine, plain_pairs, mode):
    """Five tokens at temperature 1.5 over top-4, 120 seeds each: the histograms of (token 3, token 4) under
    plain sampling (llama.cpp's chain) and prompt-lookup speculation, explicit or the default (Leviathan et al.
    2023 rule, numpy), come from one distribution by a chi-square two-sample test at the 0.001 level."""
    plain = plain_pairs
    fast = _pairs(engine, mode, range(1000, 1120))
    cells = sorted(set(plain) | set(fast))
    a = np.array([plain.get(c, 0) for c in cells])
    b = np.array([fast.get(c, 0) for c in cells])
    stat, dof = chi_square_two_sample(a, b)
    assert chi_square_sf(stat, dof) > 1e-3, (stat, dof, cells, a, b)


def test_greedy_text_identical_past_256_tokens_of_kv(engine):
    """Past ~256 tokens of f16 KV llama.cpp's CPU flash attention gives a one-token step a split-KV path that a
    verification batch does not take, so the exact batch size is measured per depth bucket
    (``speculation.depth_bucket``): on ledgers of ~490 tokens copied out again, after short prompts measured
    the shallow bucket first, every mode's greedy text is the plain one, token for token."""
    import random

    from benchmarks.load_bench import quote_prompt

    engine.complete(greedy(items(1)[0][1], "prompt_lookup", 8))  # the shallow bucket is measured first
    rng = random.Random(41)
    for _ in range(2):
        prompt = quote_prompt(rng)
        plain_ids, plain = _ids(engine, greedy(prompt, "off", 96, ()))
        for mode in (None, "prompt_lookup", "draft"):
            ids, done = _ids(engine, greedy(prompt, mode, 96, ()))
            assert ids == plain_ids, mode
            assert done.metrics.prompt_tokens > 400
