"""Self-consistency on the real bundled model (app/engine/policies/self_consistency.py): n = 3 samples of one few-shot
arithmetic prompt, decoded in one batch, with samples 1 and 2 reusing sample 0's prompt KV (the engine's
cross-slot prompt reuse: a request whose prompt's first L-1 tokens are live in another slot copies them)."""

from __future__ import annotations

import pytest

from app.engine.local.engine import Engine
from app.engine.policies.consistency import parse_self_consistency
from app.engine.policies.self_consistency import run_self_consistency
from app.protocol.types import DecodingParams, GenerateRequest, LoadSettings
from benchmarks.reasoning_items import STOP, default_items

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def engine3(bundled_model):
    eng = Engine(bundled_model, LoadSettings(n_ctx=1024, n_parallel=3), max_queue=8)
    eng.load()
    yield eng
    eng.close()


def test_three_samples_share_the_prompt_and_vote(engine3):
    item = default_items()[0]
    req = GenerateRequest(prompt=item.prompt(), decoding=DecodingParams.make(
        temperature=0.8, max_tokens=40, stop=STOP, seed=14))
    spec = parse_self_consistency({"n": 3, "extract": "last_number", "verifier": {"regex": "[0-9]+"}})
    res = run_self_consistency(engine3, req, spec)
    assert len(res.dones) == 3 and res.seeds == (14, 15, 16)
    # Each sample ended on its own (a stop string or its 40 tokens), none cancelled or cut by a deadline.
    assert all(d.finish_reason in ("stop", "length") and "stopped_by" not in d.info for d in res.dones), \
        [(d.finish_reason, d.info.get("stopped_by")) for d in res.dones]
    assert all(d.metrics.completion_tokens <= 40 for d in res.dones)
    assert all(d.metrics.completion_tokens > 0 for d in res.dones)
    assert res.vote.n == 3 and res.vote.chosen_index is not None
    assert res.completion_tokens == sum(d.metrics.completion_tokens for d in res.dones)
    prompt = res.prompt_tokens
    assert prompt > 150 and all(d.metrics.prompt_tokens == prompt for d in res.dones)
    # Samples 1 and 2 were submitted together after sample 0's first token: decoded in one batch.
    assert max(d.metrics.batch_peak for d in res.dones[1:]) >= 2
    # ... and each copied the prompt's first L-1 tokens from sample 0's slot instead of prefilling them.
    cached = [d.metrics.cached_tokens for d in res.dones[1:]]
    assert all(c >= prompt - 1 for c in cached), (cached, prompt, [d.metrics.cache_reuse_reason for d in res.dones])
    assert res.prefilled_tokens <= prompt + 2
