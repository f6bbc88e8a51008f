"""What a finished request leaves behind in the engine process (app/engine/local/runtime.py ``end``): its
llama.cpp sampler chain is freed at once, not when Python's cycle collector runs (docs/benchmarks.md, "Soak")."""

from __future__ import annotations

import pytest

from app.protocol.types import DecodingParams, GenerateRequest, LoadSettings

pytestmark = pytest.mark.model


def test_a_finished_request_frees_its_sampler_chain(bundled_model):
    from app.engine.local.runtime import Runtime

    rt = Runtime(str(bundled_model), LoadSettings(n_ctx=512, n_parallel=2))
    req = GenerateRequest(prompt="The harbour town wakes up early:", decoding=DecodingParams.make(
        temperature=0.7, seed=3, max_tokens=4, grammar='root ::= [a-z ]+'))
    seq = rt.begin(1, req, [0, 1])
    sampler = seq.sampler
    assert sampler is not None and sampler.sampler is not None  # a chain with a grammar and dist
    while seq.finish is None:
        if not seq.prompt_done:
            rt.prefill_step([seq])
        else:
            rt.decode_step([seq])
    assert seq.n_out == 4
    rt.end(seq)
    # The chain's free callback refers to the chain itself: dropped without close() it (3 MiB of candidates
    # for Gemma's 262,144-token vocabulary, plus the grammar) lived until a full collection.
    assert sampler.sampler is None and seq.sampler is None
