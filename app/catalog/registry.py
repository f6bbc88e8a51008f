"""Which models Hearth knows, and how a name given by a person (CLI, server ``model`` field) becomes a file.

The bundled model (``paths.bundled_model_path()``, id ``gemma-3-270m-q4_k_m``) comes first, then every
``*.gguf`` file or symlink in ``paths.models_dir()`` (user files are linked there, not copied). A model's id is
its file name without ``.gguf`` (``model_id``: every adapter derives ids through it, never by slicing path
strings, so Windows paths work). Listing never fails because of one bad file: its entry carries ``error``; on a
fresh data folder the bundled model is listed with ``installed`` False until ``hearth setup`` writes it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import paths
from app.catalog.gguf import ModelInfo, inspect_model
from app.errors import HearthError, ModelNotFound

log = logging.getLogger(__name__)



def model_id(path: str | os.PathLike[str]) -> str:
    """The id of the model file at ``path``: its file name without the ``.gguf`` extension
    (``/models/Qwen3-4B-Q4_K_M.gguf`` → ``Qwen3-4B-Q4_K_M``). Parsed with ``pathlib`` for this platform, so a
    Windows path gives the same id as a POSIX one. Pure: the file need not exist."""
    return Path(path).stem


BUNDLED_MODEL_ID = model_id(paths.BUNDLED_MODEL_FILENAME)
NOT_INSTALLED = "not installed yet; run `hearth setup` to install it"


@dataclass(frozen=True)
class ModelEntry:
    """One model in the list. ``path``: where the file is (for the bundled model not yet installed: where
    ``hearth setup`` will write it); ``size_bytes``: file size (0 if missing); ``installed``: False when the file
    does not exist yet; ``bundled``: Hearth's own model; ``base_model``: True for a base (not
    instruction-tuned) model, None when unknown; ``error``: why the file cannot be used (then ``info`` is
    None)."""

    id: str
    path: str
    size_bytes: int
    installed: bool = True
    bundled: bool = False
    base_model: bool | None = None
    architecture: str | None = None
    quantization: str | None = None
    parameter_count: int | None = None
    context_length: int | None = None
    has_chat_template: bool | None = None
    error: str | None = None
    info: ModelInfo | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "info"}
        if d["error"] is None:
            del d["error"]
        return d


def _entry(path: Path, bundled: bool) -> ModelEntry:
    mid = model_id(path)
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    if bundled and not path.exists():
        return ModelEntry(mid, str(path), 0, installed=False, bundled=True, base_model=True,
                          error=NOT_INSTALLED)
    try:
        info = inspect_model(path)
    except HearthError as exc:
        return ModelEntry(mid, str(path), size, bundled=bundled, base_model=True if bundled else None,
                          error=str(exc))
    return ModelEntry(
        mid, str(path), size, bundled=bundled,
        base_model=True if bundled else (False if info.chat_template else None),
        architecture=info.architecture, quantization=info.quantization,
        parameter_count=info.parameter_count, context_length=info.context_length,
        has_chat_template=info.chat_template is not None, info=info,
    )


def model_files() -> list[Path]:
    """``*.gguf`` files and symlinks in the models folder, sorted by name (the bundled file included)."""
    folder = paths.models_dir()
    return sorted((p for p in folder.iterdir() if p.name.lower().endswith(".gguf") and not p.is_dir()),
                  key=lambda p: p.name.lower())


def list_models() -> list[ModelEntry]:
    """The bundled model first, then every GGUF in the models folder, each inspected (about 0.1 s each)."""
    bundled = paths.bundled_model_path()
    entries = [_entry(bundled, bundled=True)]
    for p in model_files():
        if p.name != bundled.name:
            entries.append(_entry(p, bundled=False))
    return entries


def resolve_model(name_or_path: str | None, allow_paths: bool = True) -> Path:
    """The file a model name means. None or "" → the bundled model (assembled from its installed packages
    if missing; no network). Otherwise, in order: an existing file path (only with ``allow_paths``: a name a
    client of the port sent is never looked up on disk); an id (file stem) or file name in the models
    folder (a link whose file is gone is skipped), exactly, then case-insensitively. Raises
    ``ModelNotFound(name, available ids)``; the file itself
    is not validated here (``inspect_model`` does that)."""
    if not name_or_path:
        return _bundled()
    if name_or_path in (BUNDLED_MODEL_ID, paths.BUNDLED_MODEL_FILENAME):
        return _bundled()
    as_path = Path(name_or_path).expanduser()
    try:
        is_file = allow_paths and as_path.is_file()
    except (OSError, ValueError):  # a name too long for a path, a NUL: not a file
        is_file = False
    if is_file:
        return as_path.resolve()
    files = [p for p in model_files() if p.exists()]  # a link whose file is gone (exists follows links) is none
    for match in (lambda p: name_or_path in (model_id(p), p.name),
                  lambda p: name_or_path.lower() in (model_id(p).lower(), p.name.lower())):
        found = [p for p in files if match(p)]
        if found:
            return found[0]
    ids = [BUNDLED_MODEL_ID] + [model_id(p) for p in files if model_id(p) != BUNDLED_MODEL_ID]
    raise ModelNotFound(name_or_path, ids)


def _bundled() -> Path:
    path = paths.bundled_model_path()
    if path.exists():
        return path
    from app.catalog.bundled import ensure_bundled_model

    log.info("bundled model missing at %s; assembling it", path)
    return ensure_bundled_model(path)

