"""What the runtime keeps per sequence of the context (``_Slot``) and per request in one (``LlamaSeq``)."""

from __future__ import annotations

from typing import Any

from app.engine.local.scheduler import Seq


class _Slot:
    """One sequence of the context: ``seq_id``, the tokens its KV holds (positions 0 … n−1, in cells 0 … n−1 of
    its own stream), ``bounds``: the positions where its KV ends a chunk of the canonical layout (the KV of
    tokens 0 … b−1 is a cold prefill's for each b in it; ``app.engine.local.layout``), and when it was last used
    (``time.perf_counter`` seconds)."""

    def __init__(self, seq_id: int) -> None:
        self.seq_id = seq_id
        self.tokens: list[int] = []
        self.bounds: set[int] = set()
        self.last_used = 0.0

    def forget(self) -> None:
        self.tokens, self.bounds = [], set()


class LlamaSeq(Seq):
    """A request in a llama.cpp slot: its prompt ``tokens``, the next prompt index to evaluate (``pos``), the
    prefix it reused (``reused`` tokens), its sampler chain (None: plain greedy), ``bounds``: where the chunks
    of its prompt's canonical layout end. The KV length is its slot's ``len(tokens)``."""

    tokens: list[int]
    bounds: list[int]  # where its layout's chunks end (``Runtime.layout``)
    pos: int = 0
    reused: int = 0
    sampler: Any = None
    t_prefill: float | None = None
    spec_mode: str | None = None  # "prompt_lookup" / "draft" when this request speculates (docs/speculative.md)
    spec_d: Any = None  # its DecodingParams (target_dist / greedy_token read them)
    spec_rng: Any = None  # numpy Generator seeded from the request (sampled verification)
    lookup: Any = None  # speculative.PromptLookup over its prompt and answer
