"""Fusing the keyword (BM25) and vector (cosine) rankings into one.

Two methods, both over each ranker's top ``candidates``, optionally weighted per query by how sharply each
ranker separates its top hit (``sharpness``) and with each ranker's first ``keep`` hits held near the top.

The reasoning: docs/retrieval.md, 'app/retrieval/fusion.py'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from app.errors import InvalidRequest

RRF_K = 60  # Cormack et al. 2009
METHODS = ("rrf", "score")

Ranking = Sequence[tuple[int, float]]  # (item id, score) best first; larger scores are better


@dataclass(frozen=True)
class FusionConfig:
    """How to fuse a BM25 and a vector ranking. ``method``: ``"rrf"`` (weighted reciprocal rank fusion) or
    ``"score"`` (normalised score fusion). ``bm25_weight`` / ``vector_weight``: each ranker's weight (>= 0,
    not both 0; only their ratio matters). ``rrf_k``: the RRF constant (>= 1; ``"rrf"`` only).
    ``sharpness``: 0 … 10; each weight is multiplied per query by ``separation(ranking) ** sharpness``, so a
    ranker whose top hit stands out counts more (0: fixed weights). ``keep``: 0 … 10; each ranker's first
    ``keep`` hits are placed no lower than position ``2·keep + 1`` of the fused order (0: off)."""

    method: str = "score"
    bm25_weight: float = 1.0
    vector_weight: float = 1.0
    rrf_k: int = RRF_K
    sharpness: float = 0.0
    keep: int = 0

    def validate(self) -> "FusionConfig":
        """Self, or ``InvalidRequest`` naming the field, its range and the value received."""
        if self.method not in METHODS:
            raise InvalidRequest(f"fusion method must be one of {', '.join(METHODS)}, got {self.method!r}",
                                 param="fusion.method")
        for name in ("bm25_weight", "vector_weight"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1e6:
                raise InvalidRequest(f"fusion {name} must be a number from 0 to 1e6, got {v!r}",
                                     param=f"fusion.{name}")
        if self.bm25_weight == 0 and self.vector_weight == 0:
            raise InvalidRequest("fusion weights must not both be 0", param="fusion.bm25_weight")
        if not isinstance(self.rrf_k, int) or isinstance(self.rrf_k, bool) or not 1 <= self.rrf_k <= 10_000:
            raise InvalidRequest(f"fusion rrf_k must be an integer from 1 to 10000, got {self.rrf_k!r}",
                                 param="fusion.rrf_k")
        v = self.sharpness
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 10:
            raise InvalidRequest(f"fusion sharpness must be a number from 0 to 10, got {v!r}",
                                 param="fusion.sharpness")
        if not isinstance(self.keep, int) or isinstance(self.keep, bool) or not 0 <= self.keep <= 10:
            raise InvalidRequest(f"fusion keep must be an integer from 0 to 10, got {self.keep!r}",
                                 param="fusion.keep")
        return self

    def describe(self) -> str:
        """A short label for tables, e.g. ``score(bm25 0.6, vector 0.4)``."""
        tail = f", k={self.rrf_k}" if self.method == "rrf" else ""
        tail += f", sharpness {self.sharpness:g}" if self.sharpness else ""
        tail += f", keep {self.keep}" if self.keep else ""
        return f"{self.method}(bm25 {self.bm25_weight:g}, vector {self.vector_weight:g}{tail})"


# Chosen by the leave-one-corpus-out rule over the six benchmark corpora (docs/retrieval.md, "Fusion";
# re-run with ``python -m benchmarks.retrieval_quality``). The fixed RRF default before it: ``OLD_FUSION``.
DEFAULT_FUSION = FusionConfig("score", 0.3, 0.7, keep=2)
OLD_FUSION = FusionConfig("rrf", 0.2, 0.8, 10)


def weighted_rrf(rankings: Sequence[Sequence[int]], weights: Sequence[float] | None = None,
                 k: int = RRF_K) -> list[tuple[int, float]]:
    """Fuse rankings (lists of ids, best first) by weighted RRF; ``(id, score)`` best first. ``weights``: one
    per ranking (None: all 1.0, the paper's RRF). Ties keep the order of first appearance (earlier rankings
    first)."""
    weights = [1.0] * len(rankings) if weights is None else list(weights)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
    scores: dict[int, float] = {}
    for ranking, w in zip(rankings, weights):
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + w / (k + rank)
    return sorted(scores.items(), key=lambda kv: -kv[1])


def normalised(ranking: Ranking) -> dict[int, float]:
    """Min-max normalised scores of one ranking: best → 1.0, worst → 0.0; all 1.0 when every score is equal
    (a single result included)."""
    if not ranking:
        return {}
    hi = max(s for _, s in ranking)
    lo = min(s for _, s in ranking)
    span = hi - lo
    return {i: ((s - lo) / span if span > 0 else 1.0) for i, s in ranking}


def score_fusion(rankings: Sequence[Ranking], weights: Sequence[float] | None = None) -> list[tuple[int, float]]:
    """Fuse scored rankings by the weighted sum of min-max normalised scores (``normalised``); an item a
    ranking lacks gets 0 from it. ``(id, score)`` best first; ties keep the order of first appearance."""
    weights = [1.0] * len(rankings) if weights is None else list(weights)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
    scores: dict[int, float] = {}
    for ranking, w in zip(rankings, weights):
        for item, s in normalised(ranking).items():
            scores[item] = scores.get(item, 0.0) + w * s
    return sorted(scores.items(), key=lambda kv: -kv[1])


def separation(ranking: Ranking) -> float:
    """How far a ranking's top score stands above the rest: ``(top − mean) / standard deviation`` over its
    scores (a z-score; 0 for fewer than two results or equal scores). Units: standard deviations."""
    if len(ranking) < 2:
        return 0.0
    scores = [s for _, s in ranking]
    mean = sum(scores) / len(scores)
    sd = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
    return (scores[0] - mean) / sd if sd > 0 else 0.0


def query_weights(lexical: Ranking, vector: Ranking, config: FusionConfig) -> tuple[float, float]:
    """The ``(bm25, vector)`` weights for one query: ``config``'s, each times ``separation ** sharpness``
    (``config.sharpness`` 0: unchanged); back to ``config``'s when both would be 0."""
    wb, wv = config.bm25_weight, config.vector_weight
    if not config.sharpness:
        return wb, wv
    b = wb * max(separation(lexical), 0.0) ** config.sharpness
    v = wv * max(separation(vector), 0.0) ** config.sharpness
    return (b, v) if b + v > 0 else (wb, wv)


def keep_tops(fused: list[tuple[int, float]], rankings: Sequence[Ranking], keep: int) -> list[tuple[int, float]]:
    """``fused`` with each ranking's first ``keep`` items within its first ``2·keep + 1`` places: a missing
    one takes the place of the lowest item there that no ranking holds in its first ``keep`` (so the fused
    first stays first unless a ranking's top displaces nothing else); the displaced items follow, in order.
    An item placed above a higher-scored one takes the highest score below it, so scores never increase
    down the list (ties where items were moved up); the order is keep_tops' and the scores only follow it.
    ``keep`` 0: ``fused`` unchanged."""
    if keep <= 0:
        return fused
    window, score = 2 * keep + 1, dict(fused)
    tops = list(dict.fromkeys(item for ranking in rankings for item, _ in ranking[:keep]))
    head = [item for item, _ in fused[:window]]
    missing = [item for item in tops if item not in head]
    for item in missing:
        drop = next(i for i in range(len(head) - 1, -1, -1) if head[i] not in tops)
        del head[drop]
    head += missing
    chosen = set(head)
    out = [(i, score.get(i, 0.0)) for i in head] + [(i, s) for i, s in fused if i not in chosen]
    floor = float("-inf")
    for n in range(len(out) - 1, -1, -1):  # from the bottom: each takes the highest score below it
        floor = max(floor, out[n][1])
        out[n] = (out[n][0], floor)
    return out


def fuse(lexical: Ranking, vector: Ranking, config: FusionConfig = DEFAULT_FUSION) -> list[tuple[int, float]]:
    """The fused ranking of a BM25 ranking and a vector ranking (each ``(id, score)`` best first) under
    ``config``: per-query weights (``query_weights``), then RRF or score fusion, then ``keep_tops``;
    ``(id, fused score)`` in fused order."""
    weights = query_weights(lexical, vector, config)
    if config.method == "rrf":
        fused = weighted_rrf([[i for i, _ in lexical], [i for i, _ in vector]], weights, config.rrf_k)
    else:
        fused = score_fusion([lexical, vector], weights)
    return keep_tops(fused, [lexical, vector], config.keep)


def relevance(lexical: Ranking, vector: Ranking, config: FusionConfig = DEFAULT_FUSION) -> dict[int, float]:
    """Each item's normalised score fusion (``score_fusion``) of the two rankings under ``config``'s weights,
    whatever ``config``'s method: a relevance in 0 … 1 that keeps each ranker's margins. RRF ranks well but
    its scores carry ranks only (ranks 1 and 4 of one ranker score 1/11 and 1/14 at k = 10), so how far a
    passage falls below the best one is read here (a chat turn's relevance floor,
    ``app.assistant.evidence.above_floor``)."""
    return dict(score_fusion([lexical, vector], (config.bm25_weight, config.vector_weight)))
