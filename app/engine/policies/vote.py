"""Candidates and the vote: ``judge`` reduces one finished sample to a ``Candidate`` (its answer and the
verifier's verdict), ``vote`` takes the majority preferring accepted candidates, and the bench's cost
accounting (cost per accepted answer, marginal gains per budget step) (docs/reasoning.md, "The vote")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Mapping, Sequence

from app.engine.policies.checks import Verdict
from app.engine.policies.consistency import SelfConsistencySpec, verify_safely


@dataclass(frozen=True)
class Candidate:
    """One sample. ``text``: its answer text (content, not reasoning); ``answer``: the extracted answer (None:
    none extractable); ``verdict``: the verifier's (None: no verifier); ``tokens``: completion tokens it cost
    (thinking included); ``seconds``: its wall time."""

    text: str
    answer: str | None
    verdict: Verdict | None = None
    tokens: int = 0
    seconds: float = 0.0

    @property
    def accepted(self) -> bool:
        return self.verdict is not None and self.verdict.accepted


def judge(spec: SelfConsistencySpec, text: str, tokens: int = 0, seconds: float = 0.0) -> Candidate:
    """Extract ``text``'s answer and run the verifier on it: the ``Candidate`` for one finished sample."""
    answer = spec.extract.extract(text)
    verdict = verify_safely(spec.verifier, answer, text) if spec.verifier else None
    return Candidate(text, answer, verdict, tokens, seconds)


@dataclass(frozen=True)
class Vote:
    """The outcome of ``vote``.

    - ``answer``: the winning answer (None when no candidate had one: ``no_answer``).
    - ``agreement``: the share of *extractable* answers (of all candidates) equal to ``answer``, 0..1.
    - ``counts``: answer → candidates giving it, over all extractable answers, in order of first appearance.
    - ``pool``: what the majority was taken over: ``"accepted"`` (the verifier accepted some candidates with
      an answer), ``"unverified"`` (there was a verifier and it accepted none of them: majority among all,
      reported as such), ``"all"`` (no verifier), ``"none"`` (no extractable answer).
    - ``pool_counts``: the counts within the pool.
    - ``tie`` / ``tied``: more than one answer had the pool's top count / those answers. The tie is broken
      deterministically: the tied answer of the earliest candidate wins.
    - ``chosen_index``: the candidate whose text to return: the earliest in the pool giving ``answer``; with
      no answer, the first accepted candidate, else candidate 0; None for an empty list.
    - ``n``, ``extractable``, ``accepted``: candidates, those with an answer, those the verifier accepted.
    """

    answer: str | None
    agreement: float
    counts: dict[str, int]
    pool: str
    pool_counts: dict[str, int]
    tie: bool
    tied: tuple[str, ...]
    no_answer: bool
    chosen_index: int | None
    n: int
    extractable: int
    accepted: int

    def to_api(self) -> dict:
        """The JSON shape of ``hearth.self_consistency`` in a response (without the candidates)."""
        return {"answer": self.answer, "agreement": round(self.agreement, 4), "counts": dict(self.counts),
                "pool": self.pool, "pool_counts": dict(self.pool_counts), "tie": self.tie,
                "tied": list(self.tied), "no_answer": self.no_answer, "chosen_index": self.chosen_index,
                "n": self.n, "extractable": self.extractable, "accepted": self.accepted}


def vote(candidates: Sequence[Candidate]) -> Vote:
    """Majority vote over ``candidates`` preferring accepted ones (``Vote`` says how it was decided)."""
    answered = [(i, c) for i, c in enumerate(candidates) if c.answer is not None]
    accepted = sum(c.accepted for c in candidates)
    counts = _count(c.answer for _, c in answered)
    pool = [(i, c) for i, c in answered if c.accepted]
    kind = "accepted"
    if not pool:
        pool = answered
        kind = "unverified" if any(c.verdict is not None for c in candidates) else "all"
    if not pool:
        first = next((i for i, c in enumerate(candidates) if c.accepted), 0 if candidates else None)
        return Vote(None, 0.0, {}, "none", {}, False, (), True, first, len(candidates), 0, accepted)
    pool_counts = _count(c.answer for _, c in pool)
    top = max(pool_counts.values())
    tied = tuple(a for a, k in pool_counts.items() if k == top)  # first-appearance order: tied[0] is earliest
    winner = tied[0]
    chosen = next(i for i, c in pool if c.answer == winner)
    return Vote(winner, counts[winner] / len(answered), counts, kind, pool_counts, len(tied) > 1,
                tied if len(tied) > 1 else (), False, chosen, len(candidates), len(answered), accepted)


def _count(answers: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in answers:
        out[a] = out.get(a, 0) + 1
    return out


# --- cost accounting for the bench -----------------------------------------------------------------------

@dataclass(frozen=True)
class Cost:
    """All attempts' cost against the answers accepted. ``tokens`` / ``seconds``: summed over every candidate
    of every item; ``accepted``: items whose answer counts as accepted; ``*_per_accepted``: ``tokens`` /
    ``seconds`` ÷ ``accepted`` (None when nothing was accepted: the cost is unbounded)."""

    items: int
    attempts: int
    tokens: int
    seconds: float
    accepted: int
    tokens_per_accepted: float | None
    seconds_per_accepted: float | None


def cost_per_accepted(candidates_by_item: Mapping[Hashable, Sequence[Candidate]],
                      accepted: Mapping[Hashable, bool] | None = None) -> Cost:
    """Cost per accepted answer = all attempts' tokens and seconds ÷ accepted answers (issue 14).

    ``candidates_by_item``: item id → its candidates (all ``n`` samples, rejected ones included).
    ``accepted``: item id → whether its final answer counts (the bench passes "the voted answer is the known
    answer"); by default an item counts when its vote took an accepted candidate (``Vote.pool == "accepted"``),
    or, where no verifier ran, when it had an answer at all."""
    items = list(candidates_by_item.items())
    if accepted is None:
        accepted = {key: vote(c).pool in ("accepted", "all") for key, c in items}
    tokens = sum(c.tokens for _, cands in items for c in cands)
    seconds = sum(c.seconds for _, cands in items for c in cands)
    good = sum(bool(accepted.get(key, False)) for key, _ in items)
    return Cost(len(items), sum(len(c) for _, c in items), tokens, seconds, good,
                tokens / good if good else None, seconds / good if good else None)


@dataclass(frozen=True)
class BudgetPoint:
    """One row of the bench: at ``budget`` (n samples, or a thinking budget in tokens) the ``accuracy`` (0..1)
    and the mean ``tokens`` and ``seconds`` spent per item."""

    budget: float
    accuracy: float
    tokens: float
    seconds: float


@dataclass(frozen=True)
class MarginalGain:
    """From one budget to the next: accuracy gained (points of 0..1), extra tokens and seconds per item, and
    the gain per 1,000 extra tokens / per extra second (None when the step cost nothing more)."""

    from_budget: float
    to_budget: float
    accuracy_gain: float
    extra_tokens: float
    extra_seconds: float
    gain_per_1k_tokens: float | None
    gain_per_second: float | None


def marginal_gains(points: Sequence[BudgetPoint]) -> list[MarginalGain]:
    """The marginal gain of each step of budget, points sorted by budget. Raises ``ValueError`` for two points
    at one budget."""
    ordered = sorted(points, key=lambda p: p.budget)
    if len({p.budget for p in ordered}) != len(ordered):
        raise ValueError("two budget points share one budget")
    out = []
    for a, b in zip(ordered, ordered[1:]):
        gain, dt, ds = b.accuracy - a.accuracy, b.tokens - a.tokens, b.seconds - a.seconds
        out.append(MarginalGain(a.budget, b.budget, gain, dt, ds, gain / dt * 1000 if dt > 0 else None,
                                gain / ds if ds > 0 else None))
    return out
