"""Render the screenshots in docs/screenshots/ offscreen (QWidget.grab) with the real bundled model:
``QT_QPA_PLATFORM=offscreen .venv/bin/python docs/screenshots/render.py``. Uses a temporary HEARTH_HOME."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO))

DOC = """# Island ferries

The ferry to Lindholm island leaves at 7:45 every morning from pier 4 and returns at 18:30.
Tickets cost 12 euros; bicycles travel free.
"""


def spin(app, cond, timeout_s: float = 120) -> None:
    from PySide6.QtCore import QEventLoop

    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError
        app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)


def main() -> int:

    from PySide6.QtWidgets import QApplication

    from app import paths
    from app.catalog.bundled import ensure_bundled_model
    from app.protocol.types import DecodingParams, LoadSettings
    from app.settings import UserSettings, save_user_settings
    from app.ui.theme import apply_theme

    paths.bundled_model_path().symlink_to(ensure_bundled_model(REPO / ".cache/models/gemma-3-270m-q4_k_m.gguf"))
    save_user_settings(UserSettings(load=LoadSettings(n_ctx=2048),
                                    decoding=DecodingParams(temperature=0.0, max_tokens=60)))
    emb = paths.models_dir() / "embeddings"
    emb.mkdir()
    for f in (REPO / ".cache/models/embeddings").glob("*.gguf"):
        (emb / f.name).symlink_to(f)  # hybrid search when the embedding model has been converted
    app = QApplication.instance() or QApplication([])
    apply_theme(app)
    from app.ui.context import AppContext
    from app.ui.main_window import MainWindow

    ctx = AppContext()
    w = MainWindow(ctx)
    w.resize(1360, 820)
    w.show()
    spin(app, lambda: ctx.engine.state == "ready")
    docs = Path(paths.home()) / "docs"
    docs.mkdir()
    (docs / "ferries.md").write_text(DOC)
    (docs / "scan.pdf").write_bytes(b"%PDF-1.4\n%%EOF\n")
    w.documents.ingest([str(docs)])
    spin(app, lambda: not ctx.docs.busy and w.documents.model.rowCount() >= 2)
    spin(app, lambda: False if time.sleep(0.3) else True)
    w.send("When does the ferry to Lindholm island leave?")
    spin(app, lambda: not ctx.chat.busy)
    w.tabs.setCurrentWidget(w.documents)
    spin(app, lambda: False if time.sleep(0.3) else True)
    w.grab().save(str(OUT / "main-window.png"))
    w.documents.grab().save(str(OUT / "documents-panel.png"))
    broken = Path(paths.home()) / "broken.gguf"
    broken.write_bytes((REPO / ".cache/models/gemma-3-270m-q4_k_m.gguf").read_bytes()[:3_000_000])
    w.models.add_files([str(broken)])
    spin(app, lambda: w.models.model.rowCount() >= 2)
    w.models.select_path(ctx.engine.job.path)
    spin(app, lambda: w.models.estimate is not None)
    w.tabs.setCurrentWidget(w.models)
    spin(app, lambda: False if time.sleep(0.3) else True)
    w.models.grab().save(str(OUT / "model-manager.png"))
    w.close()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    with tempfile.TemporaryDirectory(prefix="hearth-shots-") as home:
        os.environ["HEARTH_HOME"] = home
        sys.exit(main())
