"""The Documents page's embedding model box with a fake embedder (no model): the model search uses, choosing
another re-embeds the library on a worker with progress and then switches (the setting saved), a failed
re-embed leaves the old model with the reason marked, a file that is not a GGUF is refused with the reason,
and a recommended model not on disk goes through the app's download feature."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import FakeEmbedder
from PySide6.QtCore import QObject, Signal

from app.errors import EngineCrashed
from app.retrieval import embed_switch as sw
from app.retrieval.ingest import Ingester
from app.retrieval.store import DocumentStore
from app.settings import UserSettings

pytestmark = pytest.mark.gui


class _Downloads(QObject):
    downloaded = Signal(str)

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, str]] = []

    def download(self, repo: str, filename: str) -> bool:
        self.asked.append((repo, filename))
        return True


class _Failing(FakeEmbedder):
    def embed(self, texts, progress=None):
        raise EngineCrashed("the embedding engine died (out of memory?)")


def _file(folder: Path, name: str) -> str:
    p = folder / name
    p.write_bytes(name.encode() * 100)
    return str(p)


@pytest.fixture
def page(qtbot, tmp_path, monkeypatch):
    """A library indexed with the "old" fake model, and the panel over it; ``embedder_for`` and
    ``check_model_file`` stand in for the engine and the GGUF reader (any file is "an embedding model")."""
    from app.ui.docs_ctl import DocumentsController
    from app.ui.documents_panel import DocumentsPanel
    from app.ui.workers import WorkerPool

    old_path, new_path = _file(tmp_path, "old.gguf"), _file(tmp_path, "new.gguf")
    old = sw.ModelRef.of(old_path)
    made: dict[str, type] = {}
    monkeypatch.setattr(sw, "embedder_for", lambda ref, **kw: made.get(ref.path, FakeEmbedder)(ref.model_id))
    monkeypatch.setattr(sw, "check_model_file", lambda path, pooling=None: (sw.ModelRef.of(path, pooling), None))
    docs_dir = tmp_path / "docs"
    docs_dir.mkdir()
    for i in range(5):
        (docs_dir / f"n{i}.md").write_text(f"# Note {i}\n\nThe boiler number {i} runs at {60 + i} degrees.")
    with DocumentStore() as store:
        Ingester(store, FakeEmbedder(old.model_id), background=False).ingest([docs_dir])
        sw.reconcile(store, old)
    pool = WorkerPool()
    docs = DocumentsController(pool)
    ctx = SimpleNamespace(docs=docs, downloads=_Downloads(), settings=UserSettings(embedding_model=old_path))
    ctx.save_settings = lambda s: setattr(ctx, "settings", s)
    w = DocumentsPanel(ctx)
    qtbot.addWidget(w)
    w.paths, w.made = SimpleNamespace(old=old_path, new=new_path), made
    yield w
    assert pool.shutdown(10_000) and pool.active == 0
    docs.shutdown()


def test_choosing_a_model_reembeds_then_switches_and_saves_the_setting(page, qtbot):
    box = page.embedding
    qtbot.waitUntil(lambda: "old.gguf" in box.current.text())
    views = []
    page.docs.embedding.changed.connect(views.append)
    with qtbot.waitSignal(page.docs.embedding.switched, timeout=10_000):
        assert box.choose(page.paths.new)
    qtbot.waitUntil(lambda: "new.gguf" in box.current.text())
    assert any(v.running and v.progress is not None and v.progress.total == 5 for v in views)
    assert "Search now uses new.gguf" in box.status.text() and not box.bar.isVisible()
    assert page.ctx.settings.embedding_model == str(Path(page.paths.new).resolve())
    with DocumentStore() as store:
        assert sw.read_state(store).active.path == str(Path(page.paths.new).resolve())
    assert "new.gguf" in page.docs.search_notice()


def test_a_failed_reembed_keeps_the_old_model_and_marks_the_reason(page, qtbot):
    box = page.embedding
    page.made[str(Path(page.paths.new).resolve())] = _Failing
    box.choose(page.paths.new)
    qtbot.waitUntil(lambda: "⚠" in box.status.text(), timeout=10_000)
    assert "out of memory" in box.status.text() and "stays on the current model" in box.status.text()
    assert "old.gguf" in box.current.text()


def test_a_bad_file_is_refused_with_the_reason(page, qtbot, tmp_path, monkeypatch):
    import app.ui.embedding_box as eb
    from app.errors import ModelLoadError

    def refuse(path, pooling=None):
        raise ModelLoadError(f"{Path(path).name}: not a GGUF file", path=str(path))

    shown = []
    monkeypatch.setattr(sw, "check_model_file", refuse)
    monkeypatch.setattr(eb.QMessageBox, "warning", lambda _w, title, text: shown.append(text))
    assert not page.embedding.choose(_file(tmp_path, "notes.gguf"))
    assert shown == ["notes.gguf: not a GGUF file"]
    assert page.ctx.settings.embedding_model == page.paths.old  # unchanged


def test_a_recommended_model_not_on_disk_is_downloaded_then_used(page, qtbot, tmp_path):
    box = page.embedding
    i = next(i for i in range(box.picker.count()) if getattr(box.picker.itemData(i), "repo", None)
             and box.picker.itemData(i).path is None)
    m = box.picker.itemData(i)
    box.picker.setCurrentIndex(i)
    assert box.use_btn.text() == "Download"
    box.use_btn.click()
    assert page.ctx.downloads.asked == [(m.repo, m.file)]
    with qtbot.waitSignal(page.docs.embedding.switched, timeout=10_000):
        page.ctx.downloads.downloaded.emit(_file(tmp_path, m.file))
    assert m.file in box.current.text()
