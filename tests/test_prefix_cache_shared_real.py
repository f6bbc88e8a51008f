"""Issue 30 on the real bundled model: the disk cache serves any shared prefix. A new chat or raw prompt that
shares only its first chunks with a longer stored one is restored from disk in a new process and answers as a
cold run does, token for token; ten conversations with one preamble store it once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.engine.local.engine import Engine
from app.protocol.types import ChatMessage, DecodingParams, Delta, GenerateRequest, LoadSettings

pytestmark = pytest.mark.model

SYSTEM = ("You are the harbour office's assistant. Answer in one short sentence. The office keeps a ledger of "
          "every ship: its name, its cargo, the day it came in and the day it left, and the fee it paid. ") * 12
RAW = ("Ledger of the harbour, spring. The sloop Heron came in with salt and left with timber; the brig Swift "
       "brought copper and wool. ") * 20  # ~600 tokens


def chat(question: str, n: int = 16) -> GenerateRequest:
    return GenerateRequest(messages=(ChatMessage("system", SYSTEM), ChatMessage("user", question)),
                           decoding=DecodingParams.make(temperature=0.0, max_tokens=n))


def raw(prompt: str, n: int = 16) -> GenerateRequest:
    return GenerateRequest(prompt=prompt, decoding=DecodingParams.make(temperature=0.0, max_tokens=n))


def tokens_and_done(engine: Engine, request: GenerateRequest):
    toks, done = [], None
    for ev in engine.generate(request):
        if isinstance(ev, Delta):
            toks.extend(ev.token_ids)
        else:
            done = ev
    return toks, done


def engine(model, cache_dir) -> Engine:
    cfg = None if cache_dir is None else {"dir": str(cache_dir), "budget_bytes": 1 << 30, "min_tokens": 64}
    return Engine(model, LoadSettings(n_ctx=2048, n_parallel=1), prefix_cache=cfg)


def test_a_new_chat_with_the_same_system_prompt_starts_warm_after_a_restart(bundled_model, tmp_path):
    with engine(bundled_model, None) as cold:
        want, _ = tokens_and_done(cold, chat("Which ship brought copper?"))
    with engine(bundled_model, tmp_path) as first:
        tokens_and_done(first, chat("How is the fee written down?"))
    with engine(bundled_model, tmp_path) as second:  # a new process, a new conversation
        got, done = tokens_and_done(second, chat("Which ship brought copper?"))
    m = done.metrics
    assert m.cache_source == "disk" and m.cache_reuse == "exact", m.cache_reuse_reason
    assert m.cached_tokens >= 0.9 * (m.prompt_tokens - 16), "the whole system prompt came from disk"
    assert got == want


def test_a_prompt_sharing_only_the_first_chunks_of_a_longer_one_is_restored_exactly(bundled_model, tmp_path):
    longer = RAW + "Summer: the barque Osprey brought spice and pepper, and left with grain."
    other = RAW[: len(RAW) * 2 // 3] + "Autumn came early; nothing else was written that year."
    with engine(bundled_model, None) as cold:
        want, _ = tokens_and_done(cold, raw(other))
    with engine(bundled_model, tmp_path) as first:
        tokens_and_done(first, raw(longer))
    with engine(bundled_model, tmp_path) as second:
        got, done = tokens_and_done(second, raw(other))
        stats = second.cache_stats()
    m = done.metrics
    assert m.cache_source == "disk" and m.cached_tokens >= 256, m.cache_reuse_reason
    assert stats["restores"] == 1
    assert got == want


def _stored(cache_dir: Path) -> list[tuple[int, int, int]]:
    db = sqlite3.connect(cache_dir / "index.db")
    try:
        return db.execute('SELECT start, "end", size_bytes FROM segments ORDER BY start').fetchall()
    finally:
        db.close()


def test_ten_conversations_store_their_shared_preamble_once(bundled_model, tmp_path):
    questions = [f"Ship number {i}: what did it carry, and when did it leave?" for i in range(10)]
    with engine(bundled_model, tmp_path) as e:
        prompts = [tokens_and_done(e, chat(q, 8))[1].metrics.prompt_tokens for q in questions]
        preamble = e.count_tokens(SYSTEM.strip() + "\n\n")  # what every transcript starts with (BOS included)
    rows = _stored(tmp_path)
    assert [r[0] for r in rows].count(0) == 1, "the preamble's first chunk is stored once"
    one_each = preamble + sum(p - preamble + 8 + 4 for p in prompts)  # + the answer and the next turn's opening
    stored_tokens = sum(end - start for start, end, _ in rows)
    assert stored_tokens <= one_each < 3 * preamble, (stored_tokens, one_each, preamble)
    per_token = max(size / (end - start) for start, end, size in rows)
    assert sum(size for *_, size in rows) <= 1.05 * per_token * one_each
