"""Fusing the keyword (BM25) and vector (cosine) rankings into one.

Two methods, both over each ranker's top ``candidates``:

- **Weighted reciprocal rank fusion** (RRF: Cormack, Clarke & Büttcher, "Reciprocal Rank Fusion outperforms
  Condorcet and individual rank learning methods", SIGIR 2009): ``score(d) = Σ_r w_r / (k + rank_r(d))``,
  ranks from 1. With equal weights and k=60 it is the paper's RRF. It uses ranks only, so a BM25 hit that
  stands far above the rest counts as much as one that barely leads: that is how plain RRF pulls a clearly
  right keyword hit below passages that both rankers find middling.
- **Normalised score fusion** (the convex combination of min-max normalised scores, "CombSUM" with min-max
  normalisation: Fox & Shaw, "Combination of multiple searches", TREC-2 1994; Lee, "Analyses of multiple
  evidence combination", SIGIR 1997): each ranker's scores are mapped to [0, 1] over its own top
  ``candidates`` (best → 1, worst kept → 0; a passage a ranker did not return gets 0 from it), then
  ``score(d) = Σ_r w_r · norm_r(d)``. It keeps the *margins* of each ranker, so a strong exact-term BM25
  match keeps its lead unless the vector side is as sure of something else.

The default (``DEFAULT_FUSION``) is the method and weights chosen on the development halves of the retrieval
benchmark (``benchmarks/retrieval_quality.py --tune``, docs/retrieval.md "Fusion"): the best mean over both
question sets of dev recall@5 + MRR@10, among settings never below the better single ranker there. Re-tuned
after the lead vectors (a second vector per chunk, its heading path and first sentence; 2 December 2026):
the rule picks weighted RRF (bm25 0.2, vector 0.8, k=10), dev score 1.832 against 1.826 for the next
setting that is never below a single ranker (score fusion 0.1 / 0.9); score fusion (0.2, 0.8), the default
before, fell below vector alone on the stdlib dev half's recall@5 (0.880 against 0.920). On the whole sets
the pick is not below either single ranker (stdlib 0.960 / 0.879 against vector's 0.960 / 0.873; everyday
1.000 / 0.908 against 1.000 / 0.899). The earlier re-tune (after the signature sections) preferred the same
setting but it was not adopted then: it lowered everyday MRR@10 below vector alone on the test half, which
it no longer does (0.870 against 0.866). docs/retrieval.md has the tables.
"""

from __future__ import annotations

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
    not both 0; only their ratio matters). ``rrf_k``: the RRF constant (>= 1; ``"rrf"`` only)."""

    method: str = "score"
    bm25_weight: float = 1.0
    vector_weight: float = 1.0
    rrf_k: int = RRF_K

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
        return self

    def describe(self) -> str:
        """A short label for tables, e.g. ``score(bm25 0.6, vector 0.4)``."""
        tail = f", k={self.rrf_k}" if self.method == "rrf" else ""
        return f"{self.method}(bm25 {self.bm25_weight:g}, vector {self.vector_weight:g}{tail})"


# Chosen on the dev splits of both benchmark question sets after the lead vectors (docs/retrieval.md,
# "Fusion"; re-run with ``python -m benchmarks.retrieval_quality --tune``).
DEFAULT_FUSION = FusionConfig("rrf", 0.2, 0.8, 10)


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


def fuse(lexical: Ranking, vector: Ranking, config: FusionConfig = DEFAULT_FUSION) -> list[tuple[int, float]]:
    """The fused ranking of a BM25 ranking and a vector ranking (each ``(id, score)`` best first) under
    ``config``; ``(id, fused score)`` best first."""
    weights = (config.bm25_weight, config.vector_weight)
    if config.method == "rrf":
        return weighted_rrf([[i for i, _ in lexical], [i for i, _ in vector]], weights, config.rrf_k)
    return score_fusion([lexical, vector], weights)


def relevance(lexical: Ranking, vector: Ranking, config: FusionConfig = DEFAULT_FUSION) -> dict[int, float]:
    """Each item's normalised score fusion (``score_fusion``) of the two rankings under ``config``'s weights,
    whatever ``config``'s method: a relevance in 0 … 1 that keeps each ranker's margins. RRF ranks well but
    its scores carry ranks only (ranks 1 and 4 of one ranker score 1/11 and 1/14 at k = 10), so how far a
    passage falls below the best one is read here (a chat turn's relevance floor,
    ``app.assistant.evidence.above_floor``)."""
    return dict(score_fusion([lexical, vector], (config.bm25_weight, config.vector_weight)))
