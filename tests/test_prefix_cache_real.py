"""The persistent prefix cache on the real bundled model: restores across processes are exact, bad entries
are rejected and quarantined, and the byte budget holds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.engine.local.engine import Engine
from app.protocol.types import DecodingParams, GenerateRequest, LoadSettings

pytestmark = pytest.mark.model

LONG = ("Chapter one. The keeper climbed the spiral stairs of the lighthouse every evening at dusk, "
        "counting one hundred and twelve steps, and lit the great lamp. ") * 12  # ~400 tokens


def req(prompt, n=24):
    return GenerateRequest(prompt=prompt, decoding=DecodingParams.make(temperature=0.0, max_tokens=n))


def engine(model, cache_dir, min_tokens=64, budget=1 << 30, **kw):
    cfg = None if cache_dir is None else {"dir": str(cache_dir), "budget_bytes": budget, "min_tokens": min_tokens}
    e = Engine(model, LoadSettings(n_ctx=2048, **kw), prefix_cache=cfg)
    e.load()
    return e


def entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("*/*.seg"))


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_restore_in_new_process_is_token_identical(bundled_model, tmp_path, kv):
    with engine(bundled_model, None, type_k=kv, type_v=kv) as cold:
        ref = cold.complete(req(LONG, 40))
    with engine(bundled_model, tmp_path, type_k=kv, type_v=kv) as a:
        first = a.complete(req(LONG, 40))
    assert first.text == ref.text and first.metrics.cache_source == "none"
    assert len(entries(tmp_path)) == 2  # one segment per chunk: [0, 256) and [256, L−1)
    with engine(bundled_model, tmp_path, type_k=kv, type_v=kv) as b:
        again = b.complete(req(LONG, 40))
        assert again.metrics.cache_source == "disk"
        # the same prompt: all but its last token come from disk; only the last token is evaluated
        assert again.metrics.cached_tokens == again.metrics.prompt_tokens - 1
        assert again.metrics.restore_s > 0
        assert b.cache_stats()["restores"] == 1
    assert again.text == ref.text


@pytest.mark.parametrize("prefix", ["", LONG])
def test_shorter_prompt_after_longer_equals_cold(bundled_model, tmp_path, prefix):
    """Issue 4's trap: the second prompt is a prefix of the first; its answer must be its cold answer, in
    the same process (live KV) and after a restart (disk). With ``LONG`` in front, a real prefix is reused."""
    p1 = prefix + "Here's a funny joke. No, wait, here's a bunch of Zs: Z Z Z Z Z Z Z Z Z Z"
    p2 = prefix + "Here's a funny joke."
    with engine(bundled_model, None) as cold:
        ref = cold.complete(req(p2, 30)).text
    with engine(bundled_model, tmp_path, min_tokens=1) as e:
        e.complete(req(p1, 30))
        warm = e.complete(req(p2, 30))
        if prefix:
            assert warm.metrics.cached_tokens > 0 and warm.metrics.cache_source == "memory"
        assert warm.text == ref
    with engine(bundled_model, tmp_path, min_tokens=1) as e3:  # a new process: from disk
        restored = e3.complete(req(p2, 30))
        if prefix:
            assert restored.metrics.cache_source == "disk"
    assert restored.text == ref


@pytest.mark.parametrize("kv", ["q4_0", "q8_0"])
def test_quantized_kv_restore_and_foreign_entry_refused(bundled_model, tmp_path, kv):
    with engine(bundled_model, tmp_path / kv, type_k=kv, type_v=kv, flash_attn=True) as a:
        unsaved = a.complete(req(LONG, 20))
    with engine(bundled_model, tmp_path / kv, type_k=kv, type_v=kv, flash_attn=True) as b:
        restored = b.complete(req(LONG, 20))
    assert restored.metrics.cache_source == "disk" and restored.text == unsaved.text
    # An entry written under another KV type, put where this engine's entry is, is refused.
    other = "f16" if kv != "f16" else "q8_0"
    with engine(bundled_model, tmp_path / other, type_k=other, type_v=other) as c:
        c.complete(req(LONG, 1))
    foreign = entries(tmp_path / other)[0].read_bytes()
    for mine in entries(tmp_path / kv):
        mine.write_bytes(foreign)
    with engine(bundled_model, tmp_path / kv, type_k=kv, type_v=kv, flash_attn=True) as d:
        cold = d.complete(req(LONG, 20))
    assert "another engine configuration" in cold.metrics.cache_error
    assert cold.metrics.cache_source == "none" and cold.text == unsaved.text
    assert list((tmp_path / kv / "quarantine").iterdir())


@pytest.mark.parametrize("damage", ["half", "zero", "random", "other-model"])
def test_damaged_entries_are_quarantined_and_served_cold(bundled_model, tmp_path, damage):
    with engine(bundled_model, tmp_path) as a:
        ref = a.complete(req(LONG, 20))
    for path in entries(tmp_path):  # every segment of the prompt damaged the same way
        data = path.read_bytes()
        if damage == "half":
            path.write_bytes(data[: len(data) // 2])
        elif damage == "zero":
            path.write_bytes(b"")
        elif damage == "random":
            path.write_bytes(os.urandom(len(data)))
        else:  # same tokens, saved for another model file (different sha256 in the fingerprint)
            from app.engine.local.prefix_cache import fingerprint

            fp_other, _ = fingerprint("0" * 64, LoadSettings(n_ctx=2048))
            hdr_end = 8 + 4  # magic, format version, then the 64-character fingerprint
            path.write_bytes(data[:hdr_end] + fp_other.encode() + data[hdr_end + 64:])
    with engine(bundled_model, tmp_path) as b:
        out = b.complete(req(LONG, 20))
        assert out.metrics.cache_error, "the damaged entry was noticed"
        assert out.metrics.cache_source == "none"
        assert b.cache_stats()["rejected"] == 1
    assert out.text == ref.text
    assert list((tmp_path / "quarantine").iterdir())


def test_budget_never_exceeded_and_repeats_hit(bundled_model, tmp_path):
    cap = 50 * 1024 * 1024
    with engine(bundled_model, tmp_path, budget=cap) as e:
        prompts = [f"Document {i}. " + LONG for i in range(14)]  # ~7 MB of KV each
        for p in prompts:
            e.complete(req(p, 1))
            on_disk = sum(f.stat().st_size for f in entries(tmp_path))
            assert on_disk <= cap
        assert e.cache_stats()["evicted"] > 0
    with engine(bundled_model, tmp_path, budget=cap) as e2:
        hit = e2.complete(req(prompts[-1], 1))
        assert hit.metrics.cache_source == "disk"
