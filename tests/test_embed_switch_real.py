"""Switching the embedding model with real models: a small folder indexed with all-MiniLM-L6-v2 (384 numbers)
is re-embedded into the bundled chat model, Gemma 3 270M, used as an embedder with mean pooling (640): search
answers from the old vectors while the re-embed is stopped part-way and after the store is closed and opened
again, then from the new ones once the re-embed resumes and switches."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from app.errors import ModelLoadError
from app.retrieval import embed_switch as sw
from app.retrieval.ingest import Ingester
from app.retrieval.search import Retriever
from app.retrieval.store import DocumentStore
from app.retrieval.types import MODE_HYBRID, MODE_VECTOR

pytestmark = pytest.mark.model

NOTES = {
    "kettle.md": "# Kettle\n\nDescale the kettle every month with citric acid. It boils a litre in 3 minutes.",
    "bike.md": "# Bicycle\n\nPump the tyres to 4 bar. Oil the chain every 300 km, and wipe off what is left over.",
    "plants.md": "# Plants\n\nWater the fern twice a week. The cactus needs water once a month in winter.",
    "bread.md": "# Bread\n\nThe dough rises for two hours at room temperature, then bakes 35 minutes at 230 degrees.",
    "taxes.md": "# Taxes\n\nThe tax return is due on the 31st of July. Keep receipts for six years.",
}


def _folder(tmp_path: Path) -> Path:
    d = tmp_path / "notes"
    d.mkdir()
    for name, text in NOTES.items():
        (d / name).write_text(text)
    return d


def _dim(store: DocumentStore, model: str) -> int:
    blob = store.db.conn.execute("SELECT vector FROM embeddings WHERE model = ? LIMIT 1", [model]).fetchone()[0]
    return len(np.frombuffer(blob, dtype=np.float32))


def _top(store: DocumentStore, embedder, query: str, mode: str | None = None, k: int = 1) -> tuple[str, object]:
    """``(mode used, the best passage's file name)``; with ``k`` > 1 the names of the ``k`` best."""
    r = Retriever(store, embedder)
    try:
        found = r.search(query, k=k, mode=mode)
        names = [Path(e.path).name for e in found]
        return found.mode, names[0] if k == 1 else names
    finally:
        r.close()


def test_reembed_from_minilm_into_gemma_with_mean_pooling(tmp_path, embedding_model, bundled_model):
    mini = sw.ModelRef.of(embedding_model)
    gem, info = sw.check_model_file(bundled_model, pooling="mean")
    assert info.architecture == "gemma3" and not info.is_embedding_model and gem.model_id.endswith("+mean")
    db = tmp_path / "documents.db"
    store = DocumentStore(db)
    old = sw.embedder_for(mini, workers=1)
    new = sw.embedder_for(gem, workers=1)
    try:
        Ingester(store, old, background=False).ingest([_folder(tmp_path)])
        assert sw.reconcile(store, mini)[0] == sw.ADOPT
        chunks = store.stats()["chunks"]
        assert chunks >= 5 and _dim(store, mini.model_id) == 384
        assert sw.choose(store, gem)[0] == sw.START

        stop = threading.Event()
        part = sw.reembed(store, new, stop, lambda p: p.done >= 2 and stop.set(), batch=2)
        assert part.phase == "stopped" and 2 <= part.done < chunks
        assert _dim(store, gem.model_id) == 640
        # Search is on the old model's vectors and embeds the query with it: hybrid and vector-only answer.
        assert sw.active_ref(store) == mini
        assert _top(store, old, "how often should I oil my chain?") == (MODE_HYBRID, "bike.md")
        assert _top(store, old, "when must I file my return", MODE_VECTOR) == (MODE_VECTOR, "taxes.md")
        store.close()

        store = DocumentStore(db)  # closed mid-way: nothing lost, still on the old model, resumes
        assert sw.active_ref(store) == mini and store.vector_count(mini.model_id) == chunks
        assert sw.reconcile(store, gem)[0] == sw.RESUME
        assert _top(store, old, "how long does the dough rise?") == (MODE_HYBRID, "bread.md")
        done = sw.reembed(store, new, batch=2)
        assert done.phase == "switched" and done.done == done.total == chunks
        assert sw.active_ref(store) == gem and store.vector_count(mini.model_id) == 0
        assert store.vector_count(gem.model_id) == chunks and not store.check()
        # The new vectors answer, the query embedded by Gemma (a base chat model ranks weakly: top 3, not 1).
        mode, names = _top(store, new, "how often should I oil my chain?", k=3)
        assert mode == MODE_HYBRID and "bike.md" in names
        mode, names = _top(store, new, "when must I file my return", MODE_VECTOR, k=5)
        assert mode == MODE_VECTOR and sorted(names) == sorted(NOTES)
    finally:
        old.close()
        new.close()
        store.close()


def test_a_chat_model_without_a_pooling_is_refused_with_the_reason(bundled_model):
    with pytest.raises(ModelLoadError, match="chat model \\(gemma3\\).*give a pooling"):
        sw.check_model_file(bundled_model)
