"""Adding a GGUF file to Hearth's models folder without copying it: a symbolic link (a hard link where
symlinks are not allowed, e.g. Windows without developer mode). The file is not validated here; the models
list shows what is wrong with it (``registry.list_models``) and loading shows the engine's specific error."""

from __future__ import annotations

import os
from pathlib import Path

from app import paths
from app.errors import HearthError


def link_model(src: str | Path, models_dir: Path | None = None) -> Path:
    """Link ``src`` (a ``.gguf`` file) into the models folder; returns the link. Linking the same file twice
    returns the existing link; another file with the same name gets a ``-2``, ``-3``... suffix."""
    src = Path(src).expanduser().resolve()
    if src.suffix.lower() != ".gguf":
        raise HearthError(f"{src.name}: not a .gguf file; Hearth loads GGUF models")
    if not src.is_file():
        raise HearthError(f"{src}: no such file")
    folder = models_dir or paths.models_dir()
    dest = folder / src.name
    n = 1
    while dest.exists() or dest.is_symlink():
        if dest.resolve() == src:
            return dest
        n += 1
        dest = folder / f"{src.stem}-{n}{src.suffix}"
    try:
        dest.symlink_to(src)
    except OSError:
        try:
            os.link(src, dest)
        except OSError as exc:
            raise HearthError(f"cannot link {src} into {folder} ({exc}); copy the file there instead") from exc
    return dest
