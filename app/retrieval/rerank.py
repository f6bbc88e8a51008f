"""Optional reranking of the fused top passages by the loaded chat model (pointwise, from its logits).

The reasoning: docs/retrieval.md, 'app/retrieval/rerank.py'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from app.protocol.backend import Backend
from app.protocol.types import DecodingParams, Delta, GenerateRequest
from app.retrieval.types import Evidence

PROMPT = ("Passage:\n{passage}\n\nQuestion: {question}\n"
          "Does the passage answer the question? Answer yes or no.\nAnswer:")
MAX_PASSAGE_CHARS = 1500  # ~350 tokens: a chunk is at most 256 embedding tokens
TOP_LOGPROBS = 20


class Reranker:
    """Reorders passages by the chat model's yes/no relevance (docs/retrieval.md, 'app/retrieval/rerank.py').

    ``engine``: a loaded ``app.engine.Engine`` (``generate``, ``tokenize``); ``depth``: how many of the fused
    top passages are scored (>= 1; the rest keep their order after them); ``blend``: the model's share of the
    final score, 0..1. Raises ``ValueError`` for an out-of-range ``depth`` or ``blend``."""

    def __init__(self, engine: Backend, depth: int = 10, blend: float = 1.0) -> None:
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an integer >= 1, got {depth!r}")
        if not 0.0 <= blend <= 1.0:
            raise ValueError(f"blend must be from 0 to 1, got {blend!r}")
        self.engine, self.depth, self.blend = engine, depth, blend
        self._yes = self._ids(("yes", " yes", "Yes", " Yes"))
        self._no = self._ids(("no", " no", "No", " No"))

    def _ids(self, words: Sequence[str]) -> set[int]:
        """The single-token ids of ``words`` (a word that tokenizes into several tokens is left out)."""
        out = set()
        for w in words:
            toks = self.engine.tokenize(w, add_bos=False)
            if len(toks) == 1:
                out.add(toks[0])
        return out

    def relevance(self, question: str, passage: str) -> float:
        """``log p(yes) − log p(no)`` for the first answer token (nats); a side missing from the model's top
        ``TOP_LOGPROBS`` counts as the smallest listed log-probability minus 1."""
        prompt = PROMPT.format(passage=passage.strip()[:MAX_PASSAGE_CHARS], question=question.strip())
        req = GenerateRequest(prompt=prompt, decoding=DecodingParams(temperature=0.0, max_tokens=1),
                              want_logprobs=TOP_LOGPROBS)
        top: list[tuple[int, float]] = []
        for ev in self.engine.generate(req):
            if isinstance(ev, Delta) and ev.logprobs:
                top = list(ev.logprobs[0][2])
        if not top:
            return 0.0
        floor = min(v for _, v in top) - 1.0
        yes = _logsumexp([v for t, v in top if t in self._yes], floor)
        no = _logsumexp([v for t, v in top if t in self._no], floor)
        return yes - no

    def rerank(self, question: str, evidence: Sequence[Evidence]) -> list[Evidence]:
        """``evidence`` (fused order, best first) with its first ``depth`` reordered; each reordered item's
        ``score`` is its final blended score."""
        head, tail = list(evidence[:self.depth]), list(evidence[self.depth:])
        if len(head) < 2 or self.blend == 0.0:
            return list(evidence)
        rel = _z([self.relevance(question, e.text) for e in head])
        fused = _z([e.score for e in head])
        final = [self.blend * r + (1 - self.blend) * f for r, f in zip(rel, fused)]
        order = sorted(range(len(head)), key=lambda i: -final[i])
        return [replace(head[i], score=final[i]) for i in order] + tail


def _logsumexp(values: list[float], floor: float) -> float:
    if not values:
        return floor
    m = max(values)
    return m + math.log(sum(math.exp(v - m) for v in values))


def _z(values: list[float]) -> list[float]:
    """Standardised values (mean 0, unit variance); all 0.0 when they are all equal."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / n)
    return [(v - mean) / sd if sd > 0 else 0.0 for v in values]
