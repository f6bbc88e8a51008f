"""Speculative decoding, pure tier (app/engine/local/speculative.py): the prompt-lookup proposer and the default's
adaptive policy, greedy and sampled verification, the target distribution against llama.cpp's own sampler chain,
and chi-square checks that the Leviathan et al. (2023) rule reproduces the target distribution."""

from __future__ import annotations

import ctypes
import math
from types import SimpleNamespace

import numpy as np
import pytest

from app.engine.local import speculative as spec
from app.engine.local.speculation import SpeculationMixin
from app.engine.local.speculative import (
    STEP_COST,
    AdaptiveLookup,
    Dist,
    PromptLookup,
    add_step,
    auto_reason,
    best_guesses,
    chi_square,
    chi_square_sf,
    chi_square_two_sample,
    expected_tokens,
    greedy_token,
    ineligible_reason,
    request_rng,
    residual,
    step_cost,
    target_dist,
    verify_greedy,
    verify_sampled,
)
from app.protocol.types import DecodingParams

ALPHA = 1e-4  # a true distribution fails a test at this level once in 10,000 runs


# -- prompt lookup --------------------------------------------------------------------------------------
def test_lookup_proposes_what_followed_the_last_trigram():
    pl = PromptLookup([5, 6, 7, 8, 9, 10, 1, 2, 5, 6, 7])
    assert pl.propose(3) == [8, 9, 10]
    assert pl.propose(10) == [8, 9, 10, 1, 2, 5, 6, 7]  # runs up to the end of the history


def test_lookup_prefers_the_most_recent_occurrence():
    pl = PromptLookup([1, 2, 3, 40, 1, 2, 3, 50, 9, 1, 2, 3])
    assert pl.propose(2) == [50, 9]


def test_lookup_falls_back_to_shorter_ngrams():
    pl = PromptLookup([1, 2, 3, 4, 9, 9, 3])  # no earlier "9 9 3" or "9 3"; "3" was followed by 4
    assert pl.propose(2) == [4, 9]
    pl = PromptLookup([1, 2, 3, 4, 7, 2, 3])  # "2 3" wins over "3" alone
    assert pl.propose(1) == [4]


def test_lookup_nothing_to_propose():
    assert PromptLookup([]).propose(4) == []
    assert PromptLookup([7]).propose(4) == []
    assert PromptLookup([1, 2, 3]).propose(4) == []
    assert PromptLookup([1, 2, 1]).propose(0) == []


def test_lookup_grows_with_the_output_and_never_matches_itself():
    pl = PromptLookup([3, 4, 5], n_min=2, n_max=3)
    assert pl.propose(5) == []
    pl.extend([3, 4])
    assert pl.propose(5) == [5, 3, 4]
    pl.extend([6])
    assert pl.propose(5) == []  # "4 6" and "3 4 6" never occurred before; 1-grams are off
    assert len(pl) == 6


def test_lookup_matches_a_brute_force_search():
    rng = np.random.default_rng(0)
    for _ in range(200):
        h = [int(t) for t in rng.integers(0, 5, size=int(rng.integers(1, 40)))]
        want = []
        for n in range(min(3, len(h) - 1), 0, -1):
            tail = h[-n:]
            starts = [i for i in range(len(h) - n) if h[i:i + n] == tail]
            if starts:
                s = starts[-1] + n
                want = h[s:s + 4]
                break
        assert PromptLookup(h).propose(4) == want, h


def test_lookup_rejects_bad_ngram_sizes():
    with pytest.raises(ValueError, match="n_min"):
        PromptLookup(n_min=0)
    with pytest.raises(ValueError, match="n_min"):
        PromptLookup(n_min=3, n_max=2)



# -- the default: adaptive prompt lookup ----------------------------------------------------------------
def test_cost_model():
    assert step_cost(1) == 1.0 and step_cost(3) == STEP_COST[2]
    assert step_cost(5) == pytest.approx(STEP_COST[2] + 2 * (STEP_COST[2] - STEP_COST[1]))  # extended linearly
    assert expected_tokens(0.5, 0) == 1 and expected_tokens(0.5, 2) == 1.75 and expected_tokens(1.0, 3) == 4


def test_best_guesses_pays_for_the_bigger_decode():
    """k guesses pay when 1 + alpha + … + alpha^k > STEP_COST[k]; the most tokens per unit of time wins."""
    one = STEP_COST[1] - 1  # the break-even acceptance of one guess
    assert best_guesses(one - 0.01, 1) == 0 and best_guesses(one + 0.01, 1) == 1
    two = max(a / 1000 for a in range(1000) if expected_tokens(a / 1000, 2) <= STEP_COST[2])
    assert best_guesses(two, 2) == 0 and best_guesses(two + 0.002, 2) == 2
    assert best_guesses(0.95, 2) == 2 and best_guesses(0.95, 0) == 0
    assert best_guesses(two + 0.002, 2, row_cost=0.1) == 0  # sampled verification costs time per row
    assert best_guesses(0.01, 2, (1.0, 1.0, 1.0)) == 2  # free rows: any acceptance pays
    assert best_guesses(0.5, 2, (1.0, 1.2, 2.5)) == 1  # a dear third row: one guess


def test_the_default_skips_sampling_without_a_small_top_k():
    assert auto_reason(DecodingParams.make(temperature=0.0, top_k=0)) is None
    assert auto_reason(DecodingParams.make(temperature=0.8, top_k=40)) is None
    assert "top-k" in auto_reason(DecodingParams.make(temperature=0.8, top_k=0))
    assert "top-k" in auto_reason(DecodingParams.make(temperature=0.8, top_k=spec.AUTO_TOP_K + 1))


def test_adaptive_guesses_only_after_its_matches_proved_right():
    al = AdaptiveLookup(range(50))
    assert al.guess(2) == []
    al.extend([7])  # "7" occurred before, but a single token is not a match for the default
    assert al.guess(2) == []
    al.extend([8])  # "7 8" is: the prior (0.5) does not pay for a guess, the match's next token (9) is noted
    assert al.guess(2) == [] and al.estimate(2) == 0.5
    al.extend([9])  # the plain step emitted 9: a guess would have been kept
    assert al.guess(2) == [] and al.estimate(2) > 0.6  # now "7 8 9" matches: a size with no record yet
    al.extend([10])
    assert al.guess(2) == [11, 12] and al.estimate(3) > 0.6  # two guesses pay at this estimate


def test_adaptive_follows_the_row_being_copied_not_the_latest_one():
    """Rows of one template (a ledger: "On day D the SHIP came in from ..."): the history's last 3 tokens occur
    in every row and their latest occurrence is the last row; the longest agreement before them picks the
    row being copied."""
    rows = [[100 + r, 1, 2, 3, 4, 200 + r, 5] for r in range(6)]
    history = [t for row in rows for t in row] + rows[2][:5]  # copying row 2, up to "102 1 2 3 4"
    assert PromptLookup(history, 2, 3).propose(2) == [205, 5]  # the latest "2 3 4": the last row's
    assert AdaptiveLookup(history).match(2) == ([202, 5], 3)
    copied = [t for row in rows for t in row] + rows[2] + [103]  # row 2 done, row 3 begun
    assert AdaptiveLookup(copied).match(2) == ([1, 2], 3)


def drive(truth: list[int], n_prompt: int, k: int = 2) -> tuple[list[int], float, int]:
    """Greedy speculation with the default's policy over a known answer ``truth[n_prompt:]`` (the tokens plain
    greedy decoding emits): guesses per step, the time in one-token decodes (``step_cost``), tokens."""
    al = AdaptiveLookup(truth[:n_prompt])
    j, sizes, cost = n_prompt, [], 0.0
    while j < len(truth):
        g = al.guess(min(k, len(truth) - j - 1))
        a = 0
        while a < len(g) and g[a] == truth[j + a]:
            a += 1
        if g:
            al.observe(len(g), a)
        sizes.append(len(g))
        cost += step_cost(1 + len(g))
        al.extend(truth[j:j + a + 1])
        j += a + 1
    return sizes, cost, len(truth) - n_prompt


def test_adaptive_pays_on_an_answer_that_quotes_its_prompt():
    rng = np.random.default_rng(5)
    doc = [int(t) for t in rng.integers(0, 5000, size=300)]
    answer = doc[20:120] + [7, 7, 7] + doc[150:250]  # two quoted passages with an edit between them
    sizes, cost, n = drive(doc + answer, len(doc))
    assert n / cost >= 1.3  # tokens per one-token-decode time: the cost model's speedup
    assert max(sizes) == 2 and sizes.count(2) > len(sizes) // 2


def test_adaptive_costs_next_to_nothing_where_text_does_not_repeat():
    """A small alphabet: two-token suffixes keep matching earlier text, but the guesses are wrong (1/12). The
    default learns that from the guesses it does not make, and guesses only after a lucky streak."""
    rng = np.random.default_rng(6)
    truth = [int(t) for t in rng.integers(0, 12, size=900)]
    sizes, cost, n = drive(truth, 100)
    assert sum(1 for g in sizes if g) < 0.02 * len(sizes)
    assert cost / n <= 1.01  # within 1 % of plain decoding in the cost model, on text made to mislead it
    pl, j, always = PromptLookup(truth[:100]), 100, 0.0  # today's explicit mode guesses at every match
    while j < len(truth):
        g = pl.propose(min(2, len(truth) - j - 1))
        a = next((i for i, t in enumerate(g) if t != truth[j + i]), len(g))
        always += step_cost(1 + len(g))
        pl.extend(truth[j:j + a + 1])
        j += a + 1
    assert always / n > 1.2


class _Always(AdaptiveLookup):
    """A history whose suffix always matches, followed by 5 (the policy is what is tested)."""

    def match(self, k: int) -> tuple[list[int], int]:
        return [5, 5, 5][:k], 3


def test_adaptive_stops_and_resumes_as_its_guesses_fail_and_come_true():
    al = _Always([1, 2, 3])
    for _ in range(3):  # the matches come true: it starts guessing, two at a time
        g = al.guess(2)
        al.observe(len(g), len(g)) if g else al.extend([5])
    assert g == [5, 5]
    trace = []
    for _ in range(40):  # now the text goes elsewhere (never 5): guesses stop, and cost nothing after that
        g = al.guess(2)
        trace.append(len(g))
        if g:
            al.observe(len(g), 0)
        al.extend([6])
    assert 0 < sum(1 for n in trace if n) <= 3 and not any(trace[5:])
    assert al.estimate(3) < 0.2
    for step in range(20):  # the text repeats again: a few free observations later, it guesses again
        g = al.guess(2)
        if g:
            break
        al.extend([5])
    assert g == [5, 5] and step <= 6


def test_adaptive_speculation_equals_plain_greedy_on_a_toy_model():
    rng = np.random.default_rng(2)
    table = rng.normal(size=(8, 8, 8)).astype(np.float32)  # a small vocabulary: plenty of matches, some right

    def argmax(h):
        return greedy_token(table[h[-2], h[-1]])

    plain = [1, 2]
    while len(plain) < 200:
        plain.append(argmax(plain))
    out = [1, 2]
    al = AdaptiveLookup(out)
    drafted = 0
    while len(out) < 200:
        drafts = al.guess(2)
        v = verify_greedy(drafts, lambda i: argmax(out + drafts[:i]))
        al.observe(len(drafts), v.accepted)
        drafted += len(drafts)
        new = drafts[:v.accepted] + [v.token]
        out.extend(new)
        al.extend(new)
    assert drafted > 0 and out[:200] == plain



def _planned(request_mode, default, d=None, logprobs=0):
    """``SpeculationMixin._plan_speculation`` on stand-ins: which mode a request ends up with."""
    rt = SimpleNamespace(spec_default=default, draft=None)
    seq = SimpleNamespace(tokens=[1, 2, 3], info={}, metrics={}, spec_mode=None, spec_d=None, spec_rng=None,
                          lookup=None)
    req = SimpleNamespace(speculative=request_mode, want_logprobs=logprobs)
    SpeculationMixin._plan_speculation(rt, seq, req, d or DecodingParams.make(temperature=0.0))
    return seq


def test_the_default_mode_is_auto_and_off_still_turns_it_off():
    seq = _planned(None, None)
    assert seq.spec_mode == "auto" and isinstance(seq.lookup, AdaptiveLookup)
    assert "spec_mode" not in seq.metrics  # named in the metrics once it guesses
    assert _planned(None, "off").spec_mode is None  # per_model.<id>.speculative = "off"
    assert _planned("off", None).spec_mode is None and _planned("off", "prompt_lookup").spec_mode is None
    seq = _planned(None, "prompt_lookup")  # a model's explicit mode: today's behaviour
    assert seq.spec_mode == "prompt_lookup" and type(seq.lookup) is PromptLookup and seq.metrics["spec_mode"]
    assert _planned("prompt_lookup", "off").spec_mode == "prompt_lookup"
    assert _planned("auto", "prompt_lookup").spec_mode == "auto"
    sampled = _planned(None, None, DecodingParams.make(temperature=0.7, top_k=40))
    assert sampled.spec_mode == "auto" and sampled.lookup.row_cost == spec.SAMPLED_ROW_COST


def test_the_default_stays_quiet_where_it_cannot_speculate():
    """An explicit mode says why it is off; the default, which nobody asked for, just decodes plainly."""
    logprobs = _planned(None, None, logprobs=2)
    assert logprobs.spec_mode is None and "speculative" not in logprobs.info
    asked = _planned("prompt_lookup", None, logprobs=2)
    assert asked.spec_mode is None and "logprobs" in asked.info["speculative"]
    nucleus = _planned(None, None, DecodingParams.make(temperature=0.7, top_k=0))
    assert nucleus.spec_mode is None and "speculative" not in nucleus.info
    assert _planned("prompt_lookup", None, DecodingParams.make(temperature=0.7, top_k=0)).spec_mode


def test_the_default_guesses_only_when_its_sequence_decodes_alone():
    assert SpeculationMixin._propose(None, SimpleNamespace(spec_mode="auto"), 2) == []


# -- greedy -----------------------------------------------------------------------------------------------
def test_greedy_accepts_the_agreeing_prefix_then_corrects():
    assert verify_greedy([4, 5, 6], [4, 5, 9, 1]) == (2, 9)
    assert verify_greedy([4, 5, 6], [7, 5, 6, 1]) == (0, 7)


def test_greedy_all_accepted_gets_the_bonus_token():
    assert verify_greedy([4, 5], [4, 5, 8]) == (2, 8)
    assert verify_greedy([], [3]) == (0, 3)


def test_greedy_reads_targets_only_up_to_the_mismatch():
    seen = []

    def target(i):
        seen.append(i)
        return [4, 0, 0, 0][i]

    assert verify_greedy([4, 5, 6], target) == (1, 0)
    assert seen == [0, 1]


def test_greedy_equals_plain_greedy_on_a_toy_model():
    """Speculative greedy decoding with any proposer emits plain greedy decoding's tokens."""
    rng = np.random.default_rng(1)
    table = rng.normal(size=(16, 16, 16)).astype(np.float32)  # logits of the next token given the last two

    def argmax(h):
        return greedy_token(table[h[-2], h[-1]])

    plain = [1, 2]
    while len(plain) < 60:
        plain.append(argmax(plain))
    out = [1, 2]
    pl = PromptLookup(out)
    while len(out) < 60:
        drafts = pl.propose(5) or [int(rng.integers(16))]
        v = verify_greedy(drafts, lambda i: argmax(out + drafts[:i]))
        new = drafts[:v.accepted] + [v.token]
        out.extend(new)
        pl.extend(new)
    assert out[:60] == plain


def test_greedy_token_applies_logit_bias_in_float32():
    row = np.array([1.0, 3.0, 2.0], dtype=np.float32)
    assert greedy_token(row) == 1
    assert greedy_token(row, ((1, -100.0),)) == 2
    assert greedy_token(np.array([2.0, 2.0], dtype=np.float32)) == 0  # the first largest, as llama.cpp


# -- distributions --------------------------------------------------------------------------------------
def _chain_candidates(logits: np.ndarray, d: DecodingParams) -> tuple[np.ndarray, np.ndarray]:
    """The candidates (ids, logits after temperature) left by llama.cpp's own chain, as Runtime._sampler builds
    it without the final ``dist``."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from llama_cpp import _internals as internals

    s = internals.LlamaSampler()
    if d.logit_bias:
        s.add_logit_bias(len(logits), dict(d.logit_bias))
    if d.top_k > 0:
        s.add_top_k(d.top_k)
    s.add_typical(d.typical_p, 1)
    s.add_top_p(d.top_p, 1)
    s.add_min_p(d.min_p, 1)
    s.add_temp(d.temperature)
    arr = internals.LlamaTokenDataArray(n_vocab=len(logits))
    arr.copy_logits(logits.astype(np.float32))
    llama_cpp.llama_sampler_apply(s.sampler, ctypes.byref(arr.candidates))
    n = arr.candidates.size
    return arr.candidates_data.id[:n].astype(np.int64), arr.candidates_data.logit[:n].astype(np.float64)


CHAINS = [dict(top_k=40, top_p=0.95, min_p=0.05, temperature=0.8),  # Hearth's defaults
          dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0),
          dict(top_k=0, top_p=0.9, min_p=0.0, temperature=1.3),  # top-p over the whole vocabulary
          dict(top_k=0, top_p=1.0, min_p=0.1, temperature=0.7),
          dict(top_k=5, top_p=1.0, min_p=0.0, temperature=2.0),
          dict(top_k=50, typical_p=0.8, top_p=0.9, min_p=0.02, temperature=0.9),
          dict(top_k=0, typical_p=0.5, top_p=1.0, min_p=0.0, temperature=1.0),
          dict(top_k=40, top_p=0.95, min_p=0.05, temperature=0.8, logit_bias={3: 5.0, 7: -100.0})]


@pytest.mark.parametrize("kw", CHAINS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_target_dist_matches_llama_cpp_chain(kw):
    d = DecodingParams.make(**kw)
    rng = np.random.default_rng(2)
    for trial in range(5):
        logits = (rng.normal(size=3000) * (1 + trial)).astype(np.float32)
        ids, lg = _chain_candidates(logits, d)
        want = np.exp(lg - lg.max())
        want /= want.sum()
        got = target_dist(logits, d)
        assert sorted(got.ids.tolist()) == sorted(ids.tolist())
        order = np.argsort(ids)
        np.testing.assert_allclose(got.dense(3000)[ids[order]], want[order], rtol=1e-5, atol=1e-9)


def test_target_dist_refuses_greedy():
    with pytest.raises(ValueError, match="temperature"):
        target_dist(np.zeros(4, dtype=np.float32), DecodingParams.make(temperature=0.0))


def test_dist_basics():
    d = Dist(np.array([2, 5]), np.array([0.25, 0.75]))
    assert d.prob(5) == 0.75 and d.prob(3) == 0.0
    assert Dist.point(7).prob(7) == 1.0
    np.testing.assert_array_equal(d.dense(6), [0, 0, 0.25, 0, 0, 0.75])
    draws = [d.sample(np.random.default_rng(s)) for s in range(200)]
    assert set(draws) == {2, 5}


def test_residual_is_the_normalised_positive_part():
    p = Dist(np.array([0, 1, 2]), np.array([0.5, 0.3, 0.2]))
    q = Dist(np.array([1, 2, 3]), np.array([0.6, 0.1, 0.3]))
    r = residual(p, q)
    np.testing.assert_allclose(r.dense(4), [0.5 / 0.6, 0, 0.1 / 0.6, 0])
    assert residual(p, Dist.point(0)).prob(0) == 0.0  # a point mass: p with the guess removed
    assert residual(p, p) is p  # no positive part


# -- sampled verification keeps the target distribution ----------------------------------------------------
V = 6
P_ROWS = np.array([[0.30, 0.25, 0.20, 0.15, 0.07, 0.03],
                   [0.05, 0.40, 0.05, 0.30, 0.10, 0.10],
                   [0.10, 0.10, 0.10, 0.10, 0.10, 0.50]])
Q_ROWS = np.array([[0.10, 0.50, 0.05, 0.05, 0.25, 0.05],
                   [0.30, 0.05, 0.30, 0.05, 0.25, 0.05],
                   [0.60, 0.00, 0.10, 0.10, 0.10, 0.10]])


def _dist(row: np.ndarray) -> Dist:
    nz = np.flatnonzero(row)
    return Dist(nz.astype(np.int64), row[nz] / row[nz].sum())


def _joint_of_two(p_rows) -> np.ndarray:
    """P(first two emitted tokens = (a, b)) when position i's target is p_rows[i] whatever came before."""
    return np.outer(p_rows[0], p_rows[1]).ravel()


def _run(n: int, proposer: str, seed: int) -> np.ndarray:
    """Histogram of the first two tokens emitted by one speculative step of two guesses (plus, if needed, a
    plain step), over ``n`` runs."""
    rng = np.random.default_rng(seed)
    p = [_dist(r) for r in P_ROWS]
    q = [_dist(r) for r in Q_ROWS]
    counts = np.zeros(V * V)
    for _ in range(n):
        if proposer == "draft":
            drafts = [q[0].sample(rng), q[1].sample(rng)]
            v = verify_sampled(drafts, p, q[:2], rng)
        else:  # a deterministic proposer: always the same guesses, q = point masses
            drafts = [1, 4]
            v = verify_sampled(drafts, p, None, rng)
        out = drafts[:v.accepted] + [v.token]
        if len(out) < 2:
            out.append(p[1].sample(rng))  # the next (plain) step samples position 1 from its target
        counts[out[0] * V + out[1]] += 1
    return counts


@pytest.mark.parametrize("proposer", ["draft", "lookup"])
def test_leviathan_rule_reproduces_the_target_distribution(proposer):
    n = 40_000
    counts = _run(n, proposer, seed=3)
    stat, dof = chi_square(counts, _joint_of_two(P_ROWS) * n)
    assert chi_square_sf(stat, dof) > ALPHA, (stat, dof)


def test_the_chi_square_test_catches_a_wrong_rule():
    """Sanity check of the test's power: emitting the draft's guesses unverified gives q, which fails."""
    rng = np.random.default_rng(4)
    q = [_dist(r) for r in Q_ROWS]
    n = 40_000
    counts = np.zeros(V * V)
    for _ in range(n):
        counts[q[0].sample(rng) * V + q[1].sample(rng)] += 1
    stat, dof = chi_square(counts, _joint_of_two(P_ROWS) * n)
    assert chi_square_sf(stat, dof) < 1e-12


def test_verify_sampled_counts_and_bonus():
    p = [Dist.point(3), Dist.point(4), Dist.point(9)]
    v = verify_sampled([3, 4], p, None, np.random.default_rng(0))
    assert v == (2, 9)  # both guesses certain under p: kept, then the bonus token
    v = verify_sampled([3, 5], p, None, np.random.default_rng(0))
    assert v == (1, 4)  # p(5) = 0: rejected, the residual is p itself


def test_request_rng_is_reproducible():
    a, b = request_rng(11), request_rng(11)
    assert a.random() == b.random()


# -- eligibility and metrics ----------------------------------------------------------------------------
def test_eligibility():
    d = DecodingParams.make(temperature=0.0)
    assert ineligible_reason("prompt_lookup", d) is None
    assert ineligible_reason("draft", d.updated(logit_bias={1: -100.0})) is None
    assert ineligible_reason(None, d) == "off"
    assert "grammar" in ineligible_reason("draft", d.updated(grammar='root ::= "a"'))
    assert "penalt" in ineligible_reason("draft", d.updated(repeat_penalty=1.1))
    assert "penalt" in ineligible_reason("draft", d.updated(presence_penalty=0.5))
    assert "logprobs" in ineligible_reason("prompt_lookup", d, want_logprobs=3)


def test_add_step():
    m: dict = {}
    add_step(m, 5, 3)
    add_step(m, 4, 4)
    assert m == {"spec_drafted": 9, "spec_accepted": 7, "spec_steps": 2}


# -- the statistics themselves ----------------------------------------------------------------------------
@pytest.mark.parametrize("dof,stat,want", [(1, 3.841458820694124, 0.05), (2, 5.991464547107979, 0.05),
                                           (10, 18.307038053275146, 0.05), (5, 0.5, 0.9921544),
                                           (30, 50.89218131151707, 0.01), (100, 135.8069, 0.01)])
def test_chi_square_sf_against_tables(dof, stat, want):
    assert chi_square_sf(stat, dof) == pytest.approx(want, rel=1e-4)


def test_chi_square_sf_edges():
    assert chi_square_sf(0.0, 3) == 1.0
    assert chi_square_sf(2.0, 2) == pytest.approx(math.exp(-1.0))  # dof 2: exp(-x/2)
    with pytest.raises(ValueError):
        chi_square_sf(1.0, 0)


def test_chi_square_pools_small_cells_and_two_sample():
    stat, dof = chi_square([50, 50, 1, 0], [50, 48, 1, 1])
    assert dof == 2
    a = np.array([100, 200, 300, 2])
    stat, dof = chi_square_two_sample(a, a)
    assert stat == 0.0 and dof == 3
    stat, dof = chi_square_two_sample([300, 100], [100, 300])
    assert chi_square_sf(stat, dof) < 1e-10
    with pytest.raises(ValueError):
        chi_square([1.0, 2.0], [1.0])


def test_depth_buckets_follow_the_kv_length_at_which_kernels_change():
    """The exact verification batch is measured per bucket: every step in a bucket sees one padded KV length
    class (llama.cpp's split-KV attention for a lone row from 512 padded cells on)."""
    from app.engine.local.speculation import PROBE_ROWS, depth_bucket

    assert depth_bucket(0) == depth_bucket(256 - PROBE_ROWS) == 256  # every probed row within 256 cells
    assert depth_bucket(256 - PROBE_ROWS + 1) == 512 and depth_bucket(504) == 512
    assert depth_bucket(505) == 1024 and depth_bucket(3000) == 4096
