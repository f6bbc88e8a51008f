"""Switching the embedding model without a model: the plan (active vs pending, resume, failure), the store's
roles (m010) and the atomic switch, a re-embed stopped part-way and resumed after the store is closed, a
document added meanwhile, a failed re-embed, the file checks and the setting."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.errors import EngineCrashed, InvalidRequest, ModelLoadError
from app.retrieval import embed_switch as sw
from app.retrieval.embed_switch import ModelRef, SwitchState, plan
from app.retrieval.ingest import Ingester
from app.retrieval.store import DocumentStore
from tests.fakes import FakeEmbedder

OLD, NEW, THIRD = (ModelRef("mini@000000000001", "/m/mini.gguf"), ModelRef("big@000000000002", "/m/big.gguf"),
                   ModelRef("gem@000000000003+mean", "/m/gem.gguf", "mean"))


# --------------------------------------------------------------------------------------------------- plan

@pytest.mark.parametrize("state, desired, has, action", [
    (SwitchState(OLD), None, True, sw.KEEP),                          # no model installed: nothing to do
    (SwitchState(OLD), OLD, True, sw.KEEP),                           # already the active one
    (SwitchState(OLD, NEW), OLD, True, sw.CANCEL),                    # chose the active one again mid-way
    (SwitchState(None), NEW, False, sw.ADOPT),                        # a new library: no vectors to keep
    (SwitchState(OLD), NEW, False, sw.ADOPT),                         # indexed without vectors: nothing to keep
    (SwitchState(OLD), NEW, True, sw.START),                          # re-embed while search stays on OLD
    (SwitchState(OLD, NEW), NEW, True, sw.RESUME),                    # interrupted: go on
    (SwitchState(OLD, NEW), THIRD, True, sw.RESTART),                 # another one chosen mid-way
    (SwitchState(OLD, None, (NEW.model_id, "oom")), NEW, True, sw.BLOCKED),  # failed: not retried by itself
    (SwitchState(OLD, None, (NEW.model_id, "oom")), THIRD, True, sw.START),
])
def test_plan(state, desired, has, action):
    assert plan(state, desired, has) == action


# ------------------------------------------------------------------------------------------ the store's part

def _library(tmp_path: Path, n: int = 6) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(n):
        (folder / f"note{i}.md").write_text(f"# Note {i}\n\nThe kettle number {i} boils at {90 + i} degrees. " * 3)
    return folder


def _indexed(tmp_path: Path, old: FakeEmbedder) -> tuple[DocumentStore, Path]:
    store = DocumentStore(tmp_path / "documents.db")
    folder = _library(tmp_path)
    Ingester(store, old, background=False).ingest([folder])
    sw.reconcile(store, ModelRef(old.model_id, "/m/old.gguf"))  # a new library adopts the first model
    return store, folder


def test_a_new_library_adopts_the_chosen_model_at_once(doc_store):
    action, state = sw.reconcile(doc_store, NEW)
    assert action == sw.ADOPT and state.active == NEW and state.pending is None


def test_an_old_store_takes_the_default_as_active_when_it_holds_its_vectors(tmp_path):
    old = FakeEmbedder("mini@000000000001")
    store = DocumentStore(tmp_path / "documents.db")
    Ingester(store, old, background=False).ingest([_library(tmp_path)])
    action, state = sw.reconcile(store, NEW, default=OLD)
    assert action == sw.START and state.active == OLD and state.pending == NEW
    store.close()


def test_a_reembed_stopped_part_way_keeps_search_on_the_old_model_and_resumes_after_a_restart(tmp_path):
    old, new = FakeEmbedder("old@000000000001"), FakeEmbedder("new@000000000002")
    store, folder = _indexed(tmp_path, old)
    chunks = store.stats()["chunks"]
    assert sw.reconcile(store, ModelRef(new.model_id, "/m/new.gguf"))[0] == sw.START
    stop, seen = threading.Event(), []

    def progress(p: sw.ReembedProgress) -> None:
        seen.append((p.phase, p.done, p.total))
        if p.done >= 2:
            stop.set()

    got = sw.reembed(store, new, stop, progress, batch=2)
    assert got.phase == "stopped" and 2 <= got.done < chunks and got.total == chunks
    assert sw.read_state(store).active.model_id == old.model_id  # search still on the old vectors
    assert store.vector_count(old.model_id) == chunks
    assert "paused" in got.text() and f"/ {chunks}" in got.text()
    store.close()

    store = DocumentStore(tmp_path / "documents.db")  # the app was closed: the next start resumes
    assert sw.reconcile(store, ModelRef(new.model_id, "/m/new.gguf"))[0] == sw.RESUME
    (folder / "late.md").write_text("# Late\n\nA document added while the library is re-embedded.")
    Ingester(store, old, background=False).ingest([folder])  # indexed with the active (old) model
    done = sw.reembed(store, new, None, seen.append, batch=2)
    assert done.phase == "switched" and seen[-1].phase == "switched"
    state = sw.read_state(store)
    assert state.active.model_id == new.model_id and state.pending is None
    assert store.vector_count(new.model_id) == store.stats()["chunks"] == chunks + 1  # the late one too
    assert store.vector_count(old.model_id) == 0 and store.stats()["embeddings"] == chunks + 1
    assert store.stats()["lead_vectors"] > 0 and not store.check()
    store.close()


def test_the_lead_step_counts_leads_not_the_chunks_already_done(tmp_path):
    old, new = FakeEmbedder("old@000000000001"), FakeEmbedder("new@000000000002")
    store, _ = _indexed(tmp_path, old)
    sw.reconcile(store, ModelRef(new.model_id, "/m/new.gguf"))
    seen: list[tuple[str, str, int, int, str]] = []
    sw.reembed(store, new, None, lambda p: seen.append((p.phase, p.counting, p.done, p.total, p.text())), batch=2)
    leads = [s for s in seen if s[0] == "leads"]
    total = store.stats()["lead_vectors"]
    assert total > 2 and store.lead_counts(new.model_id) == (total, total)
    assert leads[0][2:4] == (0, total) and leads[-1][2:4] == (total, total)  # not "N / N chunks" meanwhile
    assert all(s[1] == "leads" and "passage leads" in s[4] for s in leads)
    assert [s[2] for s in leads] == sorted(s[2] for s in leads) and seen[-1][0] == "switched"
    store.close()


class _Failing(FakeEmbedder):
    """Fails on its second batch, as an engine that runs out of memory does."""

    def __init__(self, model_id: str) -> None:
        super().__init__(model_id)
        self.calls = 0

    def embed(self, texts, progress=None):
        self.calls += 1
        if self.calls > 1:
            raise EngineCrashed("the embedding engine died (out of memory?)")
        return super().embed(texts, progress)


def test_a_failed_reembed_leaves_the_old_model_active_with_the_reason(tmp_path):
    old, bad = FakeEmbedder("old@000000000001"), _Failing("bad@000000000009")
    store, _ = _indexed(tmp_path, old)
    chunks = store.stats()["chunks"]
    ref = ModelRef(bad.model_id, "/m/bad.gguf")
    sw.reconcile(store, ref)
    got = sw.reembed(store, bad, batch=2)
    assert got.phase == "failed" and "out of memory" in got.reason and "stays on the current" in got.text()
    state = sw.read_state(store)
    assert state.active.model_id == old.model_id and state.pending is None
    assert state.failed == (bad.model_id, got.reason)
    assert store.vector_count(bad.model_id) == 0 and store.vector_count(old.model_id) == chunks
    assert sw.reconcile(store, ref)[0] == sw.BLOCKED  # not retried at every start...
    assert sw.choose(store, ref)[0] == sw.START  # ...until the person chooses it again
    store.close()


def test_switch_active_refuses_while_a_chunk_lacks_the_new_vector(tmp_path):
    old, new = FakeEmbedder("old@000000000001"), FakeEmbedder("new@000000000002")
    store, _ = _indexed(tmp_path, old)
    sw.reconcile(store, ModelRef(new.model_id, "/m/new.gguf"))
    assert store.switch_active(new.model_id) is False
    assert sw.read_state(store).active.model_id == old.model_id
    with pytest.raises(ValueError, match="not the pending"):
        store.switch_active("other@1")
    with pytest.raises(ValueError, match="not the pending"):
        sw.reembed(store, FakeEmbedder("other@1"))
    store.close()


def test_choosing_the_active_model_again_cancels_the_pending_one(tmp_path):
    old, new = FakeEmbedder("old@000000000001"), FakeEmbedder("new@000000000002")
    store, _ = _indexed(tmp_path, old)
    sw.reconcile(store, ModelRef(new.model_id, "/m/new.gguf"))
    sw.reembed(store, new, _set(), None, batch=2)
    action, state = sw.reconcile(store, ModelRef(old.model_id, "/m/old.gguf"))
    assert action == sw.CANCEL and state.pending is None and store.vector_count(new.model_id) == 0
    store.close()


def _set() -> threading.Event:
    e = threading.Event()
    e.set()
    return e


# ------------------------------------------------------------------------------------- files and settings

def test_check_model_file_names_the_problem(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        sw.check_model_file(tmp_path / "missing.gguf")
    bad = tmp_path / "notes.gguf"
    bad.write_bytes(b"this is not a GGUF file at all" * 10)
    with pytest.raises(ModelLoadError, match="notes.gguf"):
        sw.check_model_file(bad)
    with pytest.raises(InvalidRequest, match="pooling must be one of mean, cls, last"):
        sw.check_model_file(bad, pooling="max")


def test_the_setting_names_the_model_and_its_pooling(tmp_path):
    from app.settings import from_dict

    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 100)
    s = from_dict({"embedding_model": str(f), "embedding_pooling": "mean"})
    ref = sw.desired_ref(s)
    assert ref.path == str(f.resolve()) and ref.pooling == "mean" and ref.model_id.endswith("+mean")
    assert ref.name == "m.gguf (mean pooling)"
    assert from_dict({"embedding_pooling": "max"}).embedding_pooling is None
    assert sw.desired_ref(from_dict({"embedding_model": str(tmp_path / "gone.gguf")})) is None


def test_a_served_embedder_is_shared_only_when_the_library_is_of_its_model(tmp_path):
    """``hearth serve`` hands its embedder (the bundled model) to the documents: after the user chose another
    model it must not embed queries for vectors of that other model; a gone model's notice names the file."""
    from app.assistant import DocumentSource

    gem = tmp_path / "gem.gguf"
    gem.write_bytes(b"GGUF")
    store = DocumentStore()
    sw.reconcile(store, ModelRef("gem@000000000003+mean", str(gem), "mean"))  # a new library adopts it
    store.close()
    same = FakeEmbedder("gem@000000000003+mean")
    docs = DocumentSource.open_default(same)
    assert docs.embedder is same
    docs.close()
    gem.unlink()  # the chosen model's file is gone: the bundled one is not used in its place
    docs = DocumentSource.open_default(FakeEmbedder("mini@000000000001"))
    assert docs.embedder is None
    assert "(" + str(gem) + ") is gone" in sw.no_model_notice(docs.store)
    docs.close()
