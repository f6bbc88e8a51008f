"""Prefix-cache reuse in a document chat: cached / prompt tokens per turn, on the real bundled model.

A 10-turn chat about two appliance manuals (``benchmarks/data/everyday_docs``: kettle and dishwasher) among
four indexed documents, ``k`` = the turn pipeline's ``DEFAULT_K`` passages per question, greedy answers of at
most ``--max-tokens`` tokens, the engine's live KV reuse (one slot, no disk cache), default ``n_batch`` (256:
reuse is in whole 256-token chunks, docs/prefix-cache.md). Two placements of the evidence:

- ``grounding``: the stateless path (``app.assistant.grounding.ground``, the port's ``hearth.documents``):
  each question keeps its evidence in its own turn, a passage is given once (docs/retrieval.md, "Evidence
  placement");
- ``stored``: the stored chat (``app.assistant.Assistant.turn``, the window and ``hearth chat``): its
  ``app.memory.context.ContextBuilder`` plans the context and the same ``ground`` places the evidence, so it
  should reuse as much as ``grounding``.

Run: ``python -m benchmarks.rag_cache [--json] [--turns N] [--paths grounding,stored]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DOCS = REPO / "benchmarks" / "data" / "everyday_docs"
CHAT_DOCS = ("kettle_manual.md", "dishwasher_manual.md", "leave_policy.md", "expenses_policy.md")
QUESTIONS = [
    "How much water can the kettle hold?",
    "And what is the least I can put in?",
    "Which temperature should I use for green tea?",
    "How long does it keep the water warm?",
    "My kettle shows E1. What does that mean?",
    "How do I descale it, and how often?",
    "Can I use vinegar for that?",
    "Now the dishwasher: which programme saves the most energy?",
    "What does error E24 mean on the dishwasher?",
    "How often should I clean its filters?",
]
N_CTX = 8192


def ingest(folder: Path, db: Path, embedder) -> object:
    """The four chat documents indexed into ``db`` (a ``DocumentStore``, returned open)."""
    from app.retrieval.ingest import Ingester
    from app.retrieval.store import DocumentStore

    folder.mkdir(parents=True, exist_ok=True)
    for name in CHAT_DOCS:
        (folder / name).write_text((DOCS / name).read_text(encoding="utf-8"), encoding="utf-8")
    store = DocumentStore(db)
    Ingester(store, embedder).ingest([str(folder)], remember=False)
    return store


def reuse_row(turn: int, metrics: dict, evidence: int) -> dict:
    """One turn's numbers: prompt and cached tokens, their ratio, passages in the prompt."""
    prompt, cached = int(metrics.get("prompt_tokens", 0)), int(metrics.get("cached_tokens", 0))
    return {"turn": turn, "prompt_tokens": prompt, "cached_tokens": cached,
            "reuse": round(cached / prompt, 3) if prompt else 0.0, "passages": evidence}


def grounding_chat(engine, docs, questions, k: int, max_tokens: int) -> list[dict]:
    """The stateless path, as an API client drives it: its own history, grounded on every request."""
    from app.assistant.grounding import ground
    from app.protocol.types import ChatMessage, DecodingParams, GenerateRequest

    history: list = []
    rows = []
    for i, q in enumerate(questions, start=1):
        history.append(ChatMessage("user", q))
        messages, g = ground(engine, docs, tuple(history), k=k, max_tokens=max_tokens)
        done = engine.complete(GenerateRequest(messages=messages,
                                               decoding=DecodingParams.make(temperature=0.0, max_tokens=max_tokens)))
        history.append(ChatMessage("assistant", done.text))
        rows.append(reuse_row(i, done.metrics.to_dict(), len(g.evidence)))
    return rows


def stored_chat(engine, docs, memory, questions, k: int, max_tokens: int) -> list[dict]:
    """The stored chat through the turn pipeline (``Assistant.send``)."""
    from app.assistant import Assistant
    from app.protocol.types import DecodingParams

    a = Assistant(engine, memory, decoding=DecodingParams.make(temperature=0.0, max_tokens=max_tokens),
                  documents=docs, k=k)
    cid = a.new_conversation()
    return [reuse_row(i, (d := a.send(cid, q)).result.metrics, len(d.evidence))
            for i, q in enumerate(questions, start=1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--turns", type=int, default=len(QUESTIONS))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--paths", default="grounding,stored")
    args = parser.parse_args(argv)
    import os

    from app.assistant.evidence import DocumentSource
    from app.assistant.turn import DEFAULT_K
    from app.catalog.bundled import ensure_bundled_model
    from app.engine.local.engine import Engine
    from app.memory import Store
    from app.protocol.types import LoadSettings
    from app.retrieval.embed_model import ensure_embedding_model
    from app.retrieval.embedder import Embedder

    out = {}
    with tempfile.TemporaryDirectory(prefix="hearth-rag-cache-") as tmp:
        os.environ.setdefault("HEARTH_HOME", str(Path(tmp) / "home"))
        emb = ensure_embedding_model(REPO / ".cache" / "models" / "embeddings" / "all-MiniLM-L6-v2-f16.gguf")
        chat = ensure_bundled_model(REPO / ".cache" / "models" / "gemma-3-270m-q4_k_m.gguf")
        with Embedder(emb) as embedder:
            store = ingest(Path(tmp) / "docs", Path(tmp) / "documents.db", embedder)
            docs = DocumentSource(store, embedder, owns_store=True)
            questions = QUESTIONS[:args.turns]
            for path in args.paths.split(","):
                with Engine(chat, LoadSettings(n_ctx=N_CTX, n_parallel=1), prefix_cache=None) as engine:
                    if path == "grounding":
                        out[path] = grounding_chat(engine, docs, questions, DEFAULT_K, args.max_tokens)
                    else:
                        memory = Store(Path(tmp) / "hearth.db")
                        out[path] = stored_chat(engine, docs, memory, questions, DEFAULT_K, args.max_tokens)
                        memory.close()
            docs.close()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for path, rows in out.items():
            print(f"\n{path}: turn, prompt tokens, cached tokens, reuse, passages in the prompt")
            for r in rows:
                print(f"  {r['turn']:>2} {r['prompt_tokens']:>6} {r['cached_tokens']:>6} {r['reuse']:>6.3f} "
                      f"{r['passages']:>3}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
