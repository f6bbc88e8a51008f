"""The recommended embedding models (``app/data/embedding_models.json``), each judged for this machine and
found on disk when installed. Qt-free. docs/retrieval.md, "Embedding models"."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from app.catalog.recommended import verdict

CATALOG = Path(__file__).resolve().parents[1] / "data" / "embedding_models.json"
# Memory allowed per embedding process beyond its weights (a 512-token batch's activations and llama.cpp's
# buffers): a deliberately generous allowance, not a measurement. Each worker process maps the same file
# (mmap), so the weights count once.
PROCESS_OVERHEAD_BYTES = 256 << 20


@dataclass(frozen=True)
class EmbeddingModelInfo:
    """One recommended embedding model. ``repo`` / ``file``: where it is on Hugging Face (``repo`` None for
    the bundled one); ``size_bytes``: the file's exact size, None when not known; ``dim``: numbers per vector;
    ``languages``: what it was trained for; ``verdict``: "fits" / "tight" / "won't fit" / "unknown" for this
    machine (``fit``); ``path``: the installed file, None when not downloaded (``locate``)."""

    id: str
    name: str
    repo: str | None
    file: str
    size_bytes: int | None
    dim: int
    languages: str
    params: int
    license: str
    blurb: str
    verdict: str = "unknown"
    need_bytes: int | None = None
    path: str | None = None

    @property
    def bundled(self) -> bool:
        return self.repo is None

    def weights_bytes(self) -> int:
        """The file size, else 2 bytes per parameter (the f16 the bundled conversion writes)."""
        return self.size_bytes or self.params * 2

    def label(self) -> str:
        """One line for a list: name, size, vector size, languages, fit, installed or not."""
        mb = f"{self.weights_bytes() / 1e6:,.0f} MB"
        size = mb if self.size_bytes else f"about {mb}"
        state = "installed" if self.path else ("run `hearth setup`" if self.bundled else "not downloaded")
        return (f"{self.name} · {size} · {self.dim} numbers · {self.languages} · {self.verdict} · {state}")


def load_catalog(path: Path | None = None) -> list[EmbeddingModelInfo]:
    """The recommended models from the data file (``path`` overrides), not yet judged nor located."""
    data = json.loads((path or CATALOG).read_text(encoding="utf-8"))
    names = set(EmbeddingModelInfo.__dataclass_fields__) - {"verdict", "need_bytes", "path"}
    return [EmbeddingModelInfo(**{k: m[k] for k in names}) for m in data["models"]]


def fit(m: EmbeddingModelInfo, ram_bytes: int | None, workers: int = 2) -> EmbeddingModelInfo:
    """``m`` judged on a machine with ``ram_bytes`` available (None: unknown): its weights once plus
    ``PROCESS_OVERHEAD_BYTES`` per embedding process (``workers``), by ``recommended.verdict``."""
    need = m.weights_bytes() + workers * PROCESS_OVERHEAD_BYTES
    return replace(m, need_bytes=need, verdict=verdict(need, ram_bytes))


def locate(m: EmbeddingModelInfo, folders: list[Path]) -> EmbeddingModelInfo:
    """``m`` with ``path`` set to the first ``folders/<file>`` that exists (a download lands in the models
    folder, the bundled conversion in ``models/embeddings``)."""
    for folder in folders:
        candidate = folder / m.file
        if candidate.is_file():
            return replace(m, path=str(candidate))
    return replace(m, path=None)


def for_machine(ram_bytes: int | None = None, folders: list[Path] | None = None,
                catalog: list[EmbeddingModelInfo] | None = None) -> list[EmbeddingModelInfo]:
    """Every recommended model judged for ``ram_bytes`` (None: detected) and located in ``folders`` (None: the
    models folder and ``models/embeddings``), in the data file's order (the bundled default first)."""
    from app import paths
    from app.catalog.memory_estimate import detect_available_ram

    ram = ram_bytes if ram_bytes is not None else detect_available_ram()
    # models/embeddings is where app.retrieval.embed_model writes the bundled conversion (catalog sits below
    # retrieval in the layers, so the folder is named here rather than imported)
    where = folders if folders is not None else [paths.models_dir() / "embeddings", paths.models_dir()]
    return [locate(fit(m, ram), where) for m in (catalog if catalog is not None else load_catalog())]
