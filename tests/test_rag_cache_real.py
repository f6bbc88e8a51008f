"""A 10-turn document chat on the real bundled model (Gemma 3 270M) with real retrieval (all-MiniLM-L6-v2),
each question's evidence kept in its own turn (``app.assistant.grounding.ground``): every turn reuses every
whole ``n_batch`` chunk of the previous turn's prompt (the prompt only grows at its end; the engine reuses
whole 256-token chunks of a laid-out prompt and never the answer's tokens), and from the 5th turn on at least
70 % of its prompt tokens (cached_tokens / prompt_tokens, live KV, default n_batch). Turns 2-4 are below
70 % by arithmetic, not placement: with a prompt of 600-1,900 tokens, up to 255 tokens lost to chunk
alignment plus the answer and the new passages are more than 30 % of the next prompt (docs/retrieval.md,
"Evidence placement"). The chat and the documents are ``benchmarks/rag_cache.py``'s, which also measures the
stored chat's placement."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.rag_cache import N_CTX, QUESTIONS, grounding_chat, ingest

pytestmark = [pytest.mark.model, pytest.mark.slow]
MIN_REUSE = 0.70
FROM_TURN = 5


@pytest.fixture(scope="module")
def docs(tmp_path_factory, embedding_model: Path):
    from app.assistant.evidence import DocumentSource
    from app.retrieval.embedder import Embedder

    tmp = tmp_path_factory.mktemp("rag-cache")
    embedder = Embedder(embedding_model)
    store = ingest(tmp / "docs", tmp / "documents.db", embedder)
    source = DocumentSource(store, embedder, owns_store=True, owns_embedder=True)
    yield source
    source.close()


def test_ten_turns_reuse_the_previous_prompt_and_70_percent_from_turn_5(bundled_model: Path, docs):
    from app.assistant.turn import DEFAULT_K
    from app.engine.engine import Engine
    from app.engine.types import LoadSettings

    with Engine(bundled_model, LoadSettings(n_ctx=N_CTX, n_parallel=1), prefix_cache=None) as engine:
        rows = grounding_chat(engine, docs, QUESTIONS, DEFAULT_K, 64)
        chunk = engine.settings.n_batch
    print("\n".join(f"turn {r['turn']}: {r['cached_tokens']}/{r['prompt_tokens']} = {r['reuse']:.3f} "
                    f"({r['passages']} passages)" for r in rows))
    assert len(rows) == 10 and rows[0]["passages"] > 0
    whole = [b for a, b in zip(rows, rows[1:]) if b["cached_tokens"] < (a["prompt_tokens"] - 1) // chunk * chunk]
    assert not whole, whole  # each turn's prompt begins with the previous one: all its whole chunks reused
    low = [r for r in rows[FROM_TURN - 1:] if r["reuse"] < MIN_REUSE]
    assert not low, low
    assert all(b["prompt_tokens"] > a["prompt_tokens"] for a, b in zip(rows, rows[1:]))  # the prompt only grows
