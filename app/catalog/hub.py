"""Hugging Face Hub search and GGUF download, with progress, cancel and resume (no Qt; run it in a worker).

Downloads go straight into the models folder and resume from huggingface_hub's ``.incomplete`` file; the Hub
client and the download function are injected, so tests never touch the network.

The reasoning: docs/ui.md, 'app/catalog/hub.py'.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import paths
from app.errors import Cancelled, HearthError

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int | None], None]  # (bytes done, total bytes or None)


class DownloadCancelled(Cancelled):
    """The person cancelled a download (the partial file is kept for a resume)."""


@dataclass(frozen=True)
class HubModel:
    """A search hit: repository id and its download count."""

    repo: str
    downloads: int = 0


@dataclass(frozen=True)
class HubFile:
    """A GGUF file in a repository; ``size_bytes`` None when the Hub did not say."""

    repo: str
    path: str
    size_bytes: int | None = None


def progress_class(on_progress: ProgressFn, cancel: threading.Event) -> type:
    """A ``tqdm`` subclass that reports bytes to ``on_progress`` and raises ``DownloadCancelled`` on cancel."""
    from tqdm.auto import tqdm

    class _Progress(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["file"] = io.StringIO()  # no terminal output from a desktop app
            super().__init__(*args, **kwargs)
            self._bytes = int(kwargs.get("initial", 0) or 0)

        def update(self, n: float | None = 1) -> bool | None:
            if cancel.is_set():
                raise DownloadCancelled("download cancelled; it resumes from here next time")
            self._bytes += int(n or 0)
            on_progress(self._bytes, int(self.total) if self.total else None)
            return super().update(n)

    return _Progress


class HubClient:
    """Search the Hub for GGUF repositories, list their GGUF files, download one into the models folder."""

    def __init__(self, api: Any = None, download: Callable[..., str] | None = None) -> None:
        self._api = api
        self._download = download

    @property
    def api(self) -> Any:
        if self._api is None:
            from huggingface_hub import HfApi

            self._api = HfApi()
        return self._api

    def search(self, query: str, limit: int = 20) -> list[HubModel]:
        """Repositories matching ``query`` that carry GGUF files, most downloaded first."""
        try:
            found = self.api.list_models(search=query or None, filter="gguf", sort="downloads", limit=limit)
            return [HubModel(m.id, int(getattr(m, "downloads", 0) or 0)) for m in found]
        except Exception as exc:  # noqa: BLE001 - offline, rate-limited...: one line for the person
            raise HearthError(f"Hugging Face search failed: {type(exc).__name__}: {exc}") from exc

    def files(self, repo: str) -> list[HubFile]:
        """The repository's GGUF model files (projector files ``mmproj*`` left out), by name."""
        try:
            entries = self.api.list_repo_tree(repo, recursive=True)
            out = [HubFile(repo, e.path, getattr(e, "size", None)) for e in entries
                   if str(e.path).lower().endswith(".gguf") and "mmproj" not in str(e.path).lower()]
        except Exception as exc:  # noqa: BLE001
            raise HearthError(f"cannot list files of {repo}: {type(exc).__name__}: {exc}") from exc
        return sorted(out, key=lambda f: f.path.lower())

    def download(self, repo: str, filename: str, on_progress: ProgressFn, cancel: threading.Event,
                 dest_dir: Path | None = None) -> Path:
        """Download ``filename`` of ``repo`` into the models folder (resuming a partial download); returns the
        file. Raises ``DownloadCancelled`` when ``cancel`` is set, ``HearthError`` on a network failure."""
        fn = self._download
        if fn is None:
            from huggingface_hub import hf_hub_download

            fn = hf_hub_download
        target = dest_dir or paths.models_dir()
        try:
            path = fn(repo_id=repo, filename=filename, local_dir=str(target),
                      tqdm_class=progress_class(on_progress, cancel))
        except DownloadCancelled:
            raise
        except Exception as exc:  # noqa: BLE001
            raise HearthError(f"download of {repo}/{filename} failed: {type(exc).__name__}: {exc}; "
                              "try again to resume") from exc
        return Path(path)
