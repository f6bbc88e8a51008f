"""Speculative decoding, the pure part: proposers and the verification rules (numpy only, no llama.cpp).

A proposer (``PromptLookup`` here; the draft model runs in the runtime) guesses the next ``k`` tokens, the
target evaluates them in one ``llama_decode``, and a verification rule over ``target_dist`` keeps what the
target agrees with, so the output is the target's own. Speculation is used only where it is exact
(``ineligible_reason``).

The reasoning: docs/speculative.md, 'Proposers', 'Verification' and 'Eligibility'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Sequence, Union

import numpy as np

LOOKUP_DRAFT = 10  # guesses per step for prompt lookup (Saxena's num_pred_tokens default)
LOOKUP_NGRAM = (1, 3)  # n-gram sizes tried, longest first (Saxena's max_ngram_size 3; llama.cpp lookup 1..4)
DRAFT_MODEL_DRAFT = 6  # guesses per step from a draft model (each costs one draft decode)
# The default ("auto": docs/speculative.md, "The default"). STEP_COST[r - 1]: one llama_decode of r tokens of one
# sequence, each with logits, in units of a one-token decode; SAMPLED_ROW_COST: target_dist of one row (sampled
# verification, numpy) in the same unit. Measured on the bundled Gemma 3 270M Q4_K_M, 2 threads
# (`hearth bench speculative --costs`).
STEP_COST = (1.0, 1.71, 1.87)
SAMPLED_ROW_COST = 0.08
AUTO_TOP_K = 1000  # a sampled request speculates by default only with 0 < top_k <= this (bounded target_dist)
AUTO_NGRAM = (2, 3)  # n-gram sizes of the default: a 1-gram match's guess was kept 39 % of the time (< break-even)
AUTO_CONTEXT = 32  # the default compares up to this many tokens before a match to pick among its occurrences
AUTO_CANDIDATES = 64  # … over at most this many of the latest occurrences of the history's last 2 tokens
AUTO_PRIOR = (1.0, 2.0)  # (kept, tried) pseudo-counts of a fresh estimate: 0.5, below break-even (no blind guess)
AUTO_DECAY = 0.8  # weight of the earlier observations at each new one (about the last 5 steps count)
TOP_P_PARTIAL = 256  # candidates sorted first for top-p, as llama.cpp's adaptive sort does above 1024

SPEC_METRIC_KEYS = ("spec_mode", "spec_drafted", "spec_accepted", "spec_steps")


# -- proposers ----------------------------------------------------------------------------------------
class PromptLookup:
    """Prompt lookup decoding over a growing token history (the prompt, then every emitted token).

    ``propose(k)`` finds the most recent earlier occurrence of the history's last n-gram, for n from
    ``n_max`` down to ``n_min`` (the first size that matches wins), and returns up to ``k`` tokens that followed
    it (fewer when the occurrence is near the end; ``[]`` when nothing matches). An index from each n-gram to
    the position after its latest occurrence is updated as tokens arrive, so a proposal costs O(n_max) dict
    look-ups whatever the history's length. Source: Saxena 2023, "Prompt Lookup Decoding"
    (github.com/apoorvumang/prompt-lookup-decoding), which scans the prompt for the n-gram; llama.cpp's
    ``common/ngram-cache`` keeps counts instead of positions. Raises ``ValueError`` for n_min < 1 or
    n_max < n_min."""

    def __init__(self, tokens: Iterable[int] = (), n_min: int = LOOKUP_NGRAM[0], n_max: int = LOOKUP_NGRAM[1]):
        if n_min < 1 or n_max < n_min:
            raise ValueError(f"n-gram sizes must satisfy 1 <= n_min <= n_max, got {n_min}..{n_max}")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after its latest occurrence
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens`` (emitted, final) to the history."""
        h, idx = self.tokens, self._next
        for t in tokens:
            i = len(h)  # the n-grams ending at i-1 are followed by the token at i
            for n in range(self.n_min, min(self.n_max, i) + 1):
                idx[tuple(h[i - n:i])] = i
            h.append(int(t))

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` guessed next tokens (``[]``: no earlier occurrence of any suffix n-gram, or k <= 0)."""
        return self.match(k)[0]

    def match(self, k: int) -> tuple[list[int], int]:
        """``propose(k)`` and the size n of the n-gram that matched (``([], 0)`` when none did)."""
        h = self.tokens
        L = len(h)
        if k <= 0:
            return [], 0
        for n in range(min(self.n_max, L - 1), self.n_min - 1, -1):
            at = self._next.get(tuple(h[L - n:]))
            if at is not None:
                return h[at:min(at + k, L)], n
        return [], 0


def step_cost(rows: int, table: Sequence[float] = STEP_COST) -> float:
    """The time of one ``llama_decode`` of ``rows`` tokens of one sequence, each with logits, in units of a
    one-token decode: ``table[rows - 1]``, extended linearly past its end by its last increment."""
    if rows <= len(table):
        return float(table[rows - 1])
    step = table[-1] - table[-2] if len(table) > 1 else 1.0
    return float(table[-1] + (rows - len(table)) * step)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one verification step of ``k`` guesses emits on average when each guess is kept with
    probability ``alpha`` given the ones before it: 1 + alpha + … + alpha^k (the kept guesses, then the
    target's own token; Leviathan et al. 2023 §3.1, with a constant acceptance rate)."""
    return sum(alpha ** i for i in range(k + 1))


def best_guesses(alpha: float, k_max: int, table: Sequence[float] = STEP_COST, row_cost: float = 0.0) -> int:
    """The number of guesses k in 0 … ``k_max`` with the most expected tokens per unit of decode time:
    ``expected_tokens(alpha, k) / (step_cost(k + 1) + row_cost · (k + 1))`` against 1 for a plain step (k = 0).
    ``row_cost``: extra time per verified row (sampled verification's ``target_dist``), in one-token decodes.
    Ties go to fewer guesses."""
    best, rate = 0, 1.0
    for k in range(1, k_max + 1):
        r = expected_tokens(alpha, k) / (step_cost(k + 1, table) + row_cost * (k + 1))
        if r > rate + 1e-12:
            best, rate = k, r
    return best



class AdaptiveLookup(PromptLookup):
    """Prompt lookup that guesses only where it pays: the default when neither the request nor the model's
    settings name a mode (``"auto"``; docs/speculative.md, "The default").

    Matches come from the occurrence, among the latest ``AUTO_CANDIDATES`` of the history's last 2 tokens, that
    agrees with the history over the most tokens before it (up to ``AUTO_CONTEXT``; the latest among equals):
    in text that repeats a template (ledger rows, code lines, JSON records) the latest occurrence of a 2- or
    3-token n-gram is often another row than the one being copied, and the longest agreement finds the right
    one (docs/speculative.md, "The default"). The matched length n (2, or 3 for 3 and more) keys an estimate
    of the acceptance rate alpha = kept ÷ tried guesses (a guess is tried when every guess before it in its
    step was kept), from the prior ``AUTO_PRIOR``, each observation's counts added after the earlier ones are
    weighted by ``AUTO_DECAY``. ``guess(k)`` gives:

    - ``[]`` when the history's last 2 tokens never occurred before: the step decodes one token and this costs
      the dict look-ups only;
    - ``[]`` when ``best_guesses`` finds that no guess pays at the estimate for the matched size. The match's
      first token is remembered, and the next ``guess`` compares it with the token the plain step emitted: a
      free observation of one tried guess (kept when they are equal; for a sampled request they are equal
      with probability p(guess), a point-mass guess's acceptance). So the estimate keeps learning while no
      guesses are made, and guessing resumes once text starts repeating;
    - else ``best_guesses(alpha, …)`` of the tokens that followed the match (at most ``k``).

    ``row_cost``: the extra time per verified row in one-token decodes (``SAMPLED_ROW_COST`` for a sampled
    request, 0 for greedy); ``table``: ``STEP_COST``. ``observe(drafted, accepted)`` records the outcome of
    the last guesses."""

    def __init__(self, tokens: Iterable[int] = (), row_cost: float = 0.0, table: Sequence[float] = STEP_COST):
        self._occ: dict[tuple[int, int], list[int]] = {}  # 2-gram -> indices of the token after each occurrence
        super().__init__(tokens, *AUTO_NGRAM)
        self.row_cost, self.table = row_cost, tuple(table)
        self._est: dict[int, list[float]] = {}  # matched size -> [kept, tried], decayed
        self._last = 0  # the matched size the last guesses came from
        self._shadow: tuple[int, int, int] | None = None  # (size, history length, token) of an unmade guess

    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens`` (emitted, final) to the history."""
        h, occ = self.tokens, self._occ
        for t in tokens:
            i = len(h)
            if i >= 2:
                occ.setdefault((h[i - 2], h[i - 1]), []).append(i)
            h.append(int(t))

    def match(self, k: int) -> tuple[list[int], int]:
        """Up to ``k`` tokens after the best occurrence of the history's last 2 tokens (see the class) and its
        size: the tokens it agrees over, capped at ``AUTO_NGRAM[-1]``; ``([], 0)`` when there is none."""
        h = self.tokens
        L = len(h)
        if k <= 0 or L < 3:
            return [], 0
        occ = self._occ.get((h[L - 2], h[L - 1]))
        if not occ:
            return [], 0
        best_at, best_n = 0, 0
        for at in reversed(occ[-AUTO_CANDIDATES:]):
            n, top = 2, min(AUTO_CONTEXT, at)
            while n < top and h[at - n - 1] == h[L - n - 1]:
                n += 1
            if n > best_n:
                best_at, best_n = at, n
                if n >= AUTO_CONTEXT:
                    break
        return h[best_at:min(best_at + k, L)], min(best_n, AUTO_NGRAM[-1])

    def estimate(self, n: int) -> float:
        """The current acceptance estimate for matches of ``n`` tokens (the prior's before any observation)."""
        kept, tried = self._est.get(n, AUTO_PRIOR)
        return kept / tried

    def _record(self, n: int, tried: int, kept: int) -> None:
        e = self._est.setdefault(n, list(AUTO_PRIOR))
        e[0] = e[0] * AUTO_DECAY + kept
        e[1] = e[1] * AUTO_DECAY + tried

    def guess(self, k: int) -> list[int]:
        """This step's guesses, at most ``k`` (see the class docstring)."""
        if self._shadow is not None:
            n, at, token = self._shadow
            self._shadow = None
            if len(self.tokens) > at:
                self._record(n, 1, int(self.tokens[at] == token))
        toks, n = self.match(k)
        if not toks:
            return []
        best = best_guesses(self.estimate(n), len(toks), self.table, self.row_cost)
        if best == 0:
            self._shadow = (n, len(self.tokens), toks[0])
            return []
        self._last = n
        return toks[:best]

    def observe(self, drafted: int, accepted: int) -> None:
        """The last ``guess`` gave ``drafted`` tokens and verification kept the first ``accepted``."""
        if drafted > 0:
            self._record(self._last, accepted + (accepted < drafted), accepted)


# -- distributions ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dist:
    """A sparse distribution over token ids: ``ids`` (int64, shape (m,)) with ``probs`` (float64, shape (m,),
    positive, summing to 1). ``sample`` draws with one uniform from ``rng``."""

    ids: np.ndarray
    probs: np.ndarray

    @staticmethod
    def point(token: int) -> "Dist":
        """The point mass on ``token`` (the proposal of a deterministic proposer)."""
        return Dist(np.array([token], dtype=np.int64), np.array([1.0]))

    def prob(self, token: int) -> float:
        """Probability of ``token`` (0.0 outside the support)."""
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        """One token drawn from the distribution (inverse CDF of one ``rng.random()``)."""
        c = np.cumsum(self.probs)
        i = int(np.searchsorted(c, rng.random() * c[-1], side="right"))
        return int(self.ids[min(i, len(self.ids) - 1)])

    def dense(self, n_vocab: int) -> np.ndarray:
        """The probabilities as a dense float64 vector of shape (n_vocab,)."""
        out = np.zeros(n_vocab)
        out[self.ids] = self.probs
        return out


def _from_weights(ids: np.ndarray, w: np.ndarray) -> Dist:
    keep = w > 0
    ids, w = ids[keep], w[keep]
    return Dist(ids.astype(np.int64), w / w.sum())


def residual(p: Dist, q: Dist) -> Dist:
    """normalise(max(0, p − q)) over the union of both supports (Leviathan et al. 2023, §2.3): what a rejected
    guess is replaced by. When p − q has no positive mass (p == q, where nothing is ever rejected, or a float
    rounding case) it is p itself."""
    ids = np.union1d(p.ids, q.ids)
    pv = np.zeros(len(ids))
    qv = np.zeros(len(ids))
    pv[np.searchsorted(ids, p.ids)] = p.probs
    qv[np.searchsorted(ids, q.ids)] = q.probs
    w = np.maximum(pv - qv, 0.0)
    if not w.sum() > 0:
        return p
    return _from_weights(ids, w)


def biased_logits(logits: np.ndarray, logit_bias: Sequence[tuple[int, float]] = ()) -> np.ndarray:
    """``logits`` (float32, shape (n_vocab,)) with each bias added in float32, as llama.cpp's ``logit_bias``
    sampler adds it (a copy when there is any bias; the row itself otherwise)."""
    x = np.asarray(logits, dtype=np.float32)
    if logit_bias:
        x = x.copy()
        for tok, bias in logit_bias:
            x[tok] += np.float32(bias)
    return x


def greedy_token(logits: np.ndarray, logit_bias: Sequence[tuple[int, float]] = ()) -> int:
    """The first largest logit after ``logit_bias`` (what ``llama_sampler_init_greedy`` selects)."""
    return int(np.argmax(biased_logits(logits, logit_bias)))


def _sorted_desc(ids: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((ids, -vals))  # by logit, descending; ties by id
    return ids[order], vals[order]


def _softmax32(vals: np.ndarray) -> np.ndarray:
    e = np.exp(vals - vals.max(), dtype=np.float32)
    return e / e.sum(dtype=np.float32)


def target_dist(logits: np.ndarray, d) -> Dist:
    """The distribution llama.cpp's sampler chain draws from for one logits row at temperature > 0.

    ``logits``: float32, shape (n_vocab,). ``d``: a ``DecodingParams`` (fields read: logit_bias, top_k,
    typical_p, top_p, min_p, temperature). The chain is the one ``Runtime._sampler`` builds, in its order, with
    the semantics of llama.cpp's ``src/llama-sampler.cpp`` (the version vendored by llama-cpp-python 0.3.36):

    - logit bias: float32 add;
    - top_k (k > 0): the k largest logits;
    - typical (typical_p < 1, Meister et al. 2023 "Locally Typical Sampling"): softmax, then candidates in
      increasing |−log p − H| until the cumulative probability exceeds typical_p (at least one kept);
    - top_p (< 1, Holtzman et al. 2020 "The Curious Case of Neural Text Degeneration"): softmax of the current
      candidates, then the smallest prefix in descending order whose float32 cumulative probability is
      ≥ top_p;
    - min_p (> 0, Nguyen et al. 2024 "Turning Up the Heat: Min-p Sampling"): logits ≥ max + log(min_p)
      (float32), i.e. p ≥ min_p · p_max;
    - temperature: logits / T (float32), then softmax (the ``dist`` sampler).

    Ties at a top-k boundary are kept by lower id (llama.cpp's partial sort leaves them unspecified), and the
    float32 sums here are pairwise where llama.cpp's are sequential: a threshold decision can differ only
    when a cumulative sum lands within a float32 rounding of top_p. Raises ``ValueError`` for temperature 0
    (greedy has no distribution: use ``greedy_token``)."""
    if d.temperature <= 0:
        raise ValueError("target_dist needs temperature > 0 (greedy decoding uses greedy_token)")
    x = biased_logits(logits, d.logit_bias)
    n = len(x)
    ids = np.arange(n, dtype=np.int64)
    vals = x
    is_sorted = False
    if d.top_k > 0:
        k = min(d.top_k, n)
        top = np.argpartition(-x, k - 1)[:k] if k < n else ids
        ids, vals = _sorted_desc(top.astype(np.int64), x[top])
        is_sorted = True
    if d.typical_p < 1.0:
        ids, vals = _typical(ids, vals, d.typical_p)
        is_sorted = False
    if d.top_p < 1.0:
        ids, vals = _top_p(ids, vals, d.top_p, is_sorted)
        is_sorted = True
    if d.min_p > 0.0:
        keep = vals >= vals.max() + np.float32(math.log(d.min_p))
        ids, vals = ids[keep], vals[keep]
    scaled = (vals / np.float32(d.temperature)).astype(np.float64)
    w = np.exp(scaled - scaled.max())
    return _from_weights(ids, w)


def _typical(ids: np.ndarray, vals: np.ndarray, mass: float) -> tuple[np.ndarray, np.ndarray]:
    ids, vals = _sorted_desc(ids, vals)
    p = _softmax32(vals)
    with np.errstate(divide="ignore"):
        logp = np.log(p)
    entropy = -np.sum(np.where(p > 0, p * logp, 0.0), dtype=np.float32)
    order = np.argsort(np.abs(-logp - entropy), kind="stable")
    cum = np.cumsum(p[order], dtype=np.float32)
    over = np.flatnonzero(cum > np.float32(mass))
    last = int(over[0]) + 1 if over.size else len(order)
    keep = order[:last]
    return ids[keep], vals[keep]


def _top_p(ids: np.ndarray, vals: np.ndarray, mass: float, is_sorted: bool) -> tuple[np.ndarray, np.ndarray]:
    p = _softmax32(vals)
    target = np.float32(mass)
    if not is_sorted and len(vals) > TOP_P_PARTIAL:
        # Sort the few largest first: the nucleus is nearly always inside them (llama.cpp does the same).
        part = np.argpartition(-vals, TOP_P_PARTIAL - 1)[:TOP_P_PARTIAL]
        part = part[np.lexsort((ids[part], -vals[part]))]
        cum = np.cumsum(p[part], dtype=np.float32)
        hit = np.flatnonzero(cum >= target)
        if hit.size:
            keep = part[:int(hit[0]) + 1]
            return ids[keep], vals[keep]
    if not is_sorted:
        order = np.lexsort((ids, -vals))
        ids, vals, p = ids[order], vals[order], p[order]
    cum = np.cumsum(p, dtype=np.float32)
    hit = np.flatnonzero(cum >= target)
    last = int(hit[0]) + 1 if hit.size else len(vals)
    return ids[:last], vals[:last]


# -- verification ---------------------------------------------------------------------------------------
class Verdict(NamedTuple):
    """The outcome of verifying ``k`` guesses: ``accepted`` guesses kept (0 … k), then ``token``, the target's
    own next token (the correction at the first rejected guess, or the bonus token after all k)."""

    accepted: int
    token: int


Getter = Union[Sequence, Callable[[int], object]]


def _at(src: Getter, i: int):
    return src(i) if callable(src) else src[i]


def verify_greedy(drafts: Sequence[int], target: Getter) -> Verdict:
    """Greedy verification. ``drafts``: k guessed tokens; ``target``: the target's argmax at positions 0 … k
    (position i is the token after the pending token and the first i guesses), a sequence of k+1 ints or a
    callable ``i -> int`` (called only up to the first mismatch). Keeps guesses while each equals the argmax;
    the next token is the argmax at the first mismatch, or after the last guess (the bonus token). The result
    is the tokens plain greedy decoding would produce from the same logits (speculative greedy decoding,
    Leviathan et al. 2023 §3; Stern et al. 2018 "Blockwise Parallel Decoding")."""
    for i, x in enumerate(drafts):
        t = int(_at(target, i))
        if t != x:
            return Verdict(i, t)
    return Verdict(len(drafts), int(_at(target, len(drafts))))


def verify_sampled(drafts: Sequence[int], p: Getter, q: Getter | None, rng: np.random.Generator) -> Verdict:
    """Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2).

    ``drafts``: k guessed tokens, guess i drawn from ``q[i]``; ``p``: the target's ``Dist`` at positions 0 … k
    (k+1 of them; a sequence or a callable ``i -> Dist``, called only as far as verification goes); ``q``: the
    proposal's ``Dist`` per guess, or None for a deterministic proposer (q[i] = δ(drafts[i])). Guess x is kept
    with probability min(1, p(x)/q(x)) (one ``rng.random()`` per guess); at the first rejection the token is
    drawn from ``residual(p[i], q[i])``; after k kept guesses the bonus token is drawn from p[k]. Each emitted
    token is distributed exactly as the target's p given the tokens before it."""
    for i, x in enumerate(drafts):
        pi = _at(p, i)
        qi = _at(q, i) if q is not None else Dist.point(x)
        px, qx = pi.prob(x), qi.prob(x)
        if qx > 0 and rng.random() * qx < px:  # u < p/q without dividing; always true when p >= q
            continue
        return Verdict(i, residual(pi, qi).sample(rng))
    return Verdict(len(drafts), _at(p, len(drafts)).sample(rng))


def request_rng(seed: int | None) -> np.random.Generator:
    """The per-request generator of speculative sampling: ``numpy.random.default_rng(seed)`` (PCG64), so a
    seeded sampled speculative run is reproducible (fresh OS entropy when ``seed`` is None). It is not
    llama.cpp's ``dist`` RNG (mt19937): the same seed gives a different, equally distributed, sample."""
    return np.random.default_rng(seed)


# -- eligibility --------------------------------------------------------------------------------------
def ineligible_reason(mode: str | None, d, want_logprobs: int = 0) -> str | None:
    """Why a request asking for speculative ``mode`` decodes plainly (None: it may speculate). ``d``: its
    ``DecodingParams`` with any tool grammar filled in. Speculation needs a target distribution that depends
    only on the logits (docs/speculative.md, 'Eligibility'): no grammar, no repetition penalties, no logprobs."""
    if mode is None:
        return "off"
    if d.grammar:
        return "a grammar constrains decoding (its state would advance on rejected guesses)"
    if d.repeat_penalty != 1.0 or d.frequency_penalty or d.presence_penalty:
        return "repetition penalties depend on every accepted token"
    if want_logprobs:
        return "logprobs were requested"
    return None


def auto_reason(d) -> str | None:
    """Why the default (``"auto"``) does not speculate for decoding parameters ``d`` that ``ineligible_reason``
    allows (None: it may). A sampled request needs 0 < top_k <= ``AUTO_TOP_K``: otherwise ``target_dist``
    sorts up to the whole vocabulary per verified row (measured: as long as a third of a one-token decode,
    docs/speculative.md)."""
    if d.temperature > 0 and not 0 < d.top_k <= AUTO_TOP_K:
        return f"sampled without a top-k in 1..{AUTO_TOP_K} (verification would sort the whole vocabulary)"
    return None


def add_step(metrics: dict, drafted: int, accepted: int) -> None:
    """Count one verification step in a child metrics dict (``spec_drafted``, ``spec_accepted``,
    ``spec_steps``; ``Metrics.acceptance_rate`` = accepted / drafted)."""
    metrics["spec_drafted"] = metrics.get("spec_drafted", 0) + drafted
    metrics["spec_accepted"] = metrics.get("spec_accepted", 0) + accepted
    metrics["spec_steps"] = metrics.get("spec_steps", 0) + 1


# -- statistics for the tests and the benchmark -------------------------------------------------------
def chi_square(observed: Sequence[float], expected: Sequence[float], min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson's chi-square statistic and degrees of freedom of ``observed`` counts against ``expected``
    counts (same shape; the expected counts sum to the observed total). Cells with expected count below
    ``min_expected`` are pooled into one (Cochran's rule), so the statistic stays chi-square distributed.
    Raises ``ValueError`` on mismatched shapes or fewer than two cells after pooling."""
    o = np.asarray(observed, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if o.shape != e.shape:
        raise ValueError(f"observed and expected differ in shape: {o.shape} vs {e.shape}")
    small = e < min_expected
    if small.any():
        o = np.append(o[~small], o[small].sum())
        e = np.append(e[~small], e[small].sum())
        if e[-1] == 0:
            o, e = o[:-1], e[:-1]
    if len(o) < 2:
        raise ValueError("chi-square needs at least two cells with enough expected count")
    return float(np.sum((o - e) ** 2 / e)), len(o) - 1


def chi_square_two_sample(a: Sequence[float], b: Sequence[float], min_count: float = 5.0) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom of the test that two histograms ``a`` and ``b`` (counts
    over the same cells) come from one distribution (the 2 × m contingency table; cells with fewer than
    ``min_count`` counts in both histograms together are pooled). Raises ``ValueError`` as ``chi_square``."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    tot = a + b
    small = tot < min_count
    if small.any():
        a = np.append(a[~small], a[small].sum())
        b = np.append(b[~small], b[small].sum())
        tot = a + b
        if tot[-1] == 0:
            a, b, tot = a[:-1], b[:-1], tot[:-1]
    if len(tot) < 2:
        raise ValueError("chi-square needs at least two cells with enough counts")
    na, nb = a.sum(), b.sum()
    ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
    stat = float(np.sum((a - ea) ** 2 / ea) + np.sum((b - eb) ** 2 / eb))
    return stat, len(tot) - 1


def chi_square_sf(stat: float, dof: int) -> float:
    """P(X ≥ stat) for X ~ chi-square(dof): the regularized upper incomplete gamma Q(dof/2, stat/2), by its
    series for x < a + 1 and Lentz's continued fraction otherwise (Press et al., "Numerical Recipes", 3rd ed.,
    2007, §6.2, ``gammp`` / ``gammq``). Raises ``ValueError`` for dof < 1 or stat < 0."""
    if dof < 1 or stat < 0:
        raise ValueError(f"need dof >= 1 and stat >= 0, got dof={dof}, stat={stat}")
    a, x = dof / 2.0, stat / 2.0
    if x == 0:
        return 1.0
    gln = math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        for _ in range(10_000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - gln))
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    dd = 1 / b
    h = dd
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        dd = an * dd + b
        dd = tiny if abs(dd) < tiny else dd
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        dd = 1 / dd
        delta = dd * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - gln) * h
