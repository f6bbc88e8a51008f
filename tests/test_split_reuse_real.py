"""Reuse inside a chunk on the real bundled model (``layout.usable_within``, ``Runtime._probe_split``;
docs/prefix-cache.md, "Batches of 64 tokens and more"): an agent's next step reuses its previous prompt past
the last whole chunk, and its answer equals a cold run's token for token."""

from __future__ import annotations

import time

import pytest
from engine_runs import ids_and_done

from app.engine.local.engine import Engine
from app.protocol.types import DecodingParams, GenerateRequest, LoadSettings

pytestmark = pytest.mark.model

PREAMBLE = ("You are a harbour agent. Tools: ledger(ship) returns the cargo; berth(ship) returns the berth. "
            "Always call a tool before you answer, then quote its result.\n")
STEP = "Step {i}: the {ship} came in with crates of {cargo}; the harbour master asked where it should berth.\n"
SHIPS = ("Heron", "Marigold", "Kestrel", "Juniper", "Swift", "Patience")
CARGO = ("salt", "tea", "rope", "grain", "wool", "lamp oil")


def _run(engine: Engine, prompt: str, cache: bool = True):
    return ids_and_done(engine, GenerateRequest(prompt=prompt, prefix_cache=cache,
                                                decoding=DecodingParams.make(temperature=0.0, max_tokens=24)))


def test_an_agent_step_reuses_the_previous_prompt_past_its_last_chunk(bundled_model):
    with Engine(bundled_model, LoadSettings(n_ctx=4096, n_parallel=2), prefix_cache=None) as engine:
        prompt = PREAMBLE + "".join(STEP.format(i=i, ship=SHIPS[i % 6], cargo=CARGO[i % 6]) for i in range(24))
        first_ids, first = _run(engine, prompt)
        deadline = time.monotonic() + 30
        while not engine.cache_stats()["split_probed"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.cache_stats()["split_rows"] == 64  # measured on this CPU build (docs/prefix-cache.md)
        L = first.metrics.prompt_tokens
        assert L % 256 >= 64 + 1  # the previous prompt's last chunk is big: [256k, L - 1)
        for step in range(2):
            prompt = prompt + first.text + "\n" + STEP.format(i=30 + step, ship="Old Grey", cargo="timber") * 3
            warm_ids, warm = _run(engine, prompt)
            cold_ids, cold = _run(engine, prompt, cache=False)
            m = warm.metrics
            assert m.cache_reuse == "exact" and m.cached_tokens > L // 256 * 256  # past the last whole chunk
            assert "inside a chunk" in m.cache_reuse_reason or m.cached_tokens % 256 == 0
            assert cold.metrics.cached_tokens == 0
            assert warm_ids == cold_ids and warm.text == cold.text
            first, L = warm, m.prompt_tokens


def test_an_engine_whose_slots_all_hold_kv_waits_for_the_probe_without_spinning(bundled_model):
    """One slot holding the last prompt's KV: the split probe has no empty slot, and the idle engine waits for
    a request to leave instead of asking again at once (it spun a whole core before)."""
    import os

    with Engine(bundled_model, LoadSettings(n_ctx=2048, n_parallel=1), prefix_cache=None) as engine:
        _run(engine, PREAMBLE)
        time.sleep(1.0)  # past the save grace: the probe was tried

        def cpu_s() -> float:
            fields = open(f"/proc/{engine.pid}/stat").read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        before = cpu_s()
        time.sleep(2.0)
        assert cpu_s() - before < 0.5  # CPU seconds in 2 s of idling: a loop would take ~2
        stats = engine.cache_stats()
        assert not stats["split_probed"] and stats["split_rows"] == 0  # reuse keeps to chunk ends meanwhile


def _seq_state(rt, toks: list[int], splits: list[int]) -> bytes:
    """Sequence 0's KV state (llama_state_seq_get_data) after ``toks[:splits[-1]]`` went in as one
    ``llama_decode`` per part ``[splits[i-1], splits[i])``."""
    import ctypes

    lib = rt._lib
    lib.llama_memory_seq_rm(rt.mem, 0, -1, -1)
    a = 0
    for b in splits:
        rt._decode([(0, a, toks[a:b])])
        a = b
    size = lib.llama_state_seq_get_size(rt.ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    return bytes(buf[:lib.llama_state_seq_get_data(rt.ctx, buf, size, 0)])


def test_consecutive_chunks_in_one_ubatch_keep_the_bits_of_their_own_decodes(bundled_model):
    """``layout.merged_end``'s premise, at the shipped sizes: with n_ubatch 512, two canonical 256-token chunks
    evaluated in one ``llama_decode`` leave the KV state byte for byte as two decodes do; so do a 100-token
    chunk (a turn break) followed by a 256-token one, and a 3-chunk group ending in an unaligned chunk."""
    from app.engine.local.runtime import Runtime

    rt = Runtime(str(bundled_model), LoadSettings(n_ctx=2048, n_parallel=1, n_ubatch=768))
    try:
        toks = rt.tokenize(PREAMBLE + "".join(STEP.format(i=i, ship=SHIPS[i % 6], cargo=CARGO[i % 6])
                                              for i in range(40)), add_bos=True, special=False)[:900]
        assert len(toks) == 900
        assert _seq_state(rt, toks, [512, 600]) == _seq_state(rt, toks, [256, 512, 600])
        assert _seq_state(rt, toks, [356, 420]) == _seq_state(rt, toks, [100, 356, 420])
        assert _seq_state(rt, toks, [701]) == _seq_state(rt, toks, [256, 512, 701])
        # the premise's limits: a chunk under 64 tokens, or an unaligned one before another, is not the same
        assert _seq_state(rt, toks, [330]) != _seq_state(rt, toks, [30, 330])
    finally:
        rt.close()


def test_with_a_disk_cache_the_probe_runs_at_load_and_is_remembered(bundled_model, tmp_path):
    """An engine with a disk cache knows ``split_rows`` before its first request (a cold long prompt then
    merges chunks), and the next start reads the stored answer instead of measuring again."""
    import json

    cfg = {"dir": str(tmp_path / "kv")}
    with Engine(bundled_model, LoadSettings(n_ctx=2048, n_parallel=1), prefix_cache=cfg) as engine:
        stats = engine.cache_stats()
        assert stats["split_probed"] and stats["split_rows"] == 64
    facts = json.loads((tmp_path / "kv" / "engine-facts.json").read_text())
    (fp, mine), = facts.items()
    assert list(mine.values()) == [64] and next(iter(mine)).startswith("split_rows@")
    mine[next(iter(mine))] = 0  # what a backend whose kernels differ would have stored
    (tmp_path / "kv" / "engine-facts.json").write_text(json.dumps(facts))
    with Engine(bundled_model, LoadSettings(n_ctx=2048, n_parallel=1), prefix_cache=cfg) as engine:
        stats = engine.cache_stats()
        assert stats["split_probed"] and stats["split_rows"] == 0  # read, not measured again
        ids, done = _run(engine, PREAMBLE * 40)
        assert done.finish_reason in ("length", "stop") and ids
