"""Sampling: llama.cpp's own sampler chain for a request's decoding parameters (or none for plain greedy), the
next token from a row of logits, and log-probabilities."""

from __future__ import annotations

import math
import random
import time
from typing import Any

from app.engine.local.seqs import LlamaSeq
from app.errors import InvalidRequest


class SamplingMixin:
    """``Runtime``'s sampling (it holds ``llm``, ``ctx``, ``_lib``, ``n_vocab``)."""

    def _sampler(self, d) -> Any:
        """llama.cpp's sampler chain for ``d``, or None for plain greedy decoding (temperature 0 without logit
        bias, penalties or grammar): then ``_sample`` takes the first largest logit itself, which is exactly
        what ``llama_sampler_init_greedy`` selects, in 0.03 ms instead of 0.7 ms (the chain copies all 262,144
        candidates of Gemma 3's vocabulary each token; measured here)."""
        from llama_cpp import _internals as internals

        if (d.temperature == 0.0 and not d.logit_bias and not d.grammar and d.repeat_penalty == 1.0
                and not d.frequency_penalty and not d.presence_penalty):
            return None
        s = internals.LlamaSampler()
        if d.logit_bias:
            bad = [t for t, _ in d.logit_bias if t >= self.n_vocab]
            if bad:
                raise InvalidRequest(f"logit_bias token id {bad[0]} is outside the vocabulary "
                                     f"(0..{self.n_vocab - 1})", param="logit_bias")
            s.add_logit_bias(self.n_vocab, dict(d.logit_bias))
        if d.repeat_penalty != 1.0 or d.frequency_penalty or d.presence_penalty:
            s.add_penalties(self.n_vocab, 64, d.repeat_penalty, d.frequency_penalty, d.presence_penalty)
        if d.grammar:
            from app.engine.structured.grammar import add_grammar_checked

            add_grammar_checked(s, self.llm._model, d.grammar)
        if d.temperature == 0.0:
            s.add_greedy()
        else:
            seed = d.seed if d.seed is not None else random.randrange(0, 2**32 - 1)
            if d.top_k > 0:
                s.add_top_k(d.top_k)
            s.add_typical(d.typical_p, 1)
            s.add_top_p(d.top_p, 1)
            s.add_min_p(d.min_p, 1)
            s.add_temp(d.temperature)
            s.add_dist(seed)
        return s

    def _sample(self, seq: LlamaSeq, idx: int) -> None:
        """Sample ``seq``'s next token from the logits of batch row ``idx`` of the last ``llama_decode``."""
        if seq.t_first is None and seq.t_prefill is not None:
            seq.metrics["prefill_s"] = time.perf_counter() - seq.t_prefill  # through the last prompt token
        want = seq.request.want_logprobs
        lp = self._logprobs(idx, want) if want else None
        if seq.sampler is None:
            import numpy as np

            row = np.ctypeslib.as_array(self._lib.llama_get_logits_ith(self.ctx, idx), shape=(self.n_vocab,))
            token = int(row.argmax())
        else:
            token = seq.sampler.sample(self.llm._ctx, idx)
        if lp is not None:
            lp = (token, _token_lp(lp, token), [(t, v) for t, v in lp[1]])
        seq.accept(token, self.is_eog(token), self.llm._model.detokenize([token], special=False), lp)

    def _logprobs(self, idx: int, top_n: int):
        import numpy as np

        ptr = self._lib.llama_get_logits_ith(self.ctx, idx)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float64)
        m = logits.max()
        lse = m + math.log(np.exp(logits - m).sum())
        top = np.argpartition(-logits, top_n)[:top_n] if top_n > 0 else []
        top = sorted(((int(t), float(logits[t] - lse)) for t in top), key=lambda x: -x[1])
        return (logits, top, lse)


def _token_lp(lp, token: int) -> float:
    logits, _top, lse = lp
    return float(logits[token] - lse)


def close_sampler(sampler: Any) -> None:
    """Free ``sampler`` (a llama-cpp-python ``LlamaSampler`` or None) now. Its free callback holds the object
    itself (a reference cycle), so dropping it leaves the chain and its grammar's C++ state, up to a few MB
    for a JSON-schema grammar, to Python's cyclic garbage collector: in the soak the engine grew by about
    10 MiB a minute between collections (docs/benchmarks.md, "Soak")."""
    if sampler is not None:
        sampler.close()
