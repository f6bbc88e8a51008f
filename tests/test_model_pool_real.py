"""Many models behind one pool on the real bundled model (issue 15): two installed models (the bundled file and
a link to it under another name), requests alternating between them load and unload within a budget that
holds one; TTL unload observed; a broken model file answers its load error while the other keeps serving."""

from __future__ import annotations

import os
import time

import pytest

from app import paths
from app.backends import model_pool
from app.errors import ModelLoadError
from app.protocol.types import DecodingParams, GenerateRequest, LoadSettings
from app.settings import UserSettings

pytestmark = pytest.mark.model


@pytest.fixture
def two_models(bundled_model):
    folder = paths.models_dir()
    os.symlink(bundled_model, folder / paths.BUNDLED_MODEL_FILENAME)
    os.symlink(bundled_model, folder / "second-model.gguf")
    (folder / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 60)  # a header and nothing else
    return folder


def say(lease) -> str:
    req = GenerateRequest(prompt="The capital of France is", decoding=DecodingParams.make(temperature=0.0,
                                                                                          max_tokens=4))
    return lease.engine.complete(req).text


def test_alternating_models_load_on_demand_and_evict_within_the_budget(two_models):
    settings = UserSettings(load=LoadSettings(n_ctx=1024, n_parallel=1), prefix_cache=False)
    probe = model_pool(settings, budget_bytes=None)
    one = probe._estimate("second-model", str(two_models / "second-model.gguf"))
    probe.close()
    pool = model_pool(settings, budget_bytes=int(one * 1.5), ttl_s=300)  # room for one model, not two
    try:
        texts = []
        for name in ("gemma-3-270m-q4_k_m", "second-model", "gemma-3-270m-q4_k_m", "second-model.gguf"):
            with pool.acquire(name) as lease:
                texts.append(say(lease))
                assert pool.used_bytes() <= pool.budget_bytes
        assert len(set(texts)) == 1 and texts[0].strip()  # the same file answers the same
        st = pool.status()
        assert st["gemma-3-270m-q4_k_m"]["loads"] == 2 and st["second-model"]["loads"] == 2
        assert [why for _k, why in pool.unloads] == ["evicted for second-model", "evicted for gemma-3-270m-q4_k_m",
                                                     "evicted for second-model"]
        with pytest.raises(ModelLoadError) as err:
            pool.acquire("broken")
        assert "broken.gguf" in str(err.value) or err.value.path.endswith("broken.gguf")
        with pool.acquire("second-model") as lease:  # still serving, not reloaded
            assert say(lease) == texts[0]
        assert pool.status()["second-model"]["loads"] == 2
    finally:
        pool.close()


def test_an_idle_model_unloads_after_its_ttl(two_models):
    settings = UserSettings(load=LoadSettings(n_ctx=512, n_parallel=1), prefix_cache=False)
    pool = model_pool(settings, ttl_s=0.5)  # the reaper checks every second
    try:
        with pool.acquire("second-model") as lease:
            say(lease)
            pid = lease.engine.pid
            assert pid is not None
        deadline = time.monotonic() + 10
        while pool.status()["second-model"]["loaded"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pool.status()["second-model"]["loaded"]
        assert pool.unloads == [("second-model", "idle past its time to live")]
    finally:
        pool.close()
