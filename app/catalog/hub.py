"""Hugging Face Hub search and GGUF download, with progress, cancel and resume (no Qt; run it in a worker).

Downloads go straight into the models folder and resume from huggingface_hub's ``.incomplete`` file; the Hub
client and the download function are injected, so tests never touch the network.

The reasoning: docs/ui.md, 'app/catalog/hub.py'.
"""

from __future__ import annotations

import errno
import io
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import paths
from app.errors import Cancelled, HearthError

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int | None], None]  # (bytes done, total bytes or None)


OFFLINE = "Can't reach Hugging Face (no network?). Your installed models still work."
PROBE_TIMEOUT_S = 3.0  # one quick connection before a search: huggingface_hub retries 5 times (~25 s) offline
_NETWORK_ERRORS = {"ConnectError", "ConnectTimeout", "ConnectionError", "NetworkError", "TransportError",
                   "Timeout", "TimeoutException", "OfflineModeIsEnabled"}  # httpx / requests / huggingface_hub


_NETWORK_ERRNOS = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.ECONNREFUSED, errno.ECONNRESET,
                   errno.ETIMEDOUT}


def is_offline_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the Hub could not be reached at all: a socket error, or one of
    httpx's / requests' connection errors (matched by class name, so neither library is imported here). A
    file's error (a full disk, a denied folder) is not one: a download names it."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (ConnectionError, TimeoutError, socket.gaierror, socket.herror)) or (
                isinstance(seen, OSError) and seen.errno in _NETWORK_ERRNOS):
            return True
        if _NETWORK_ERRORS & {t.__name__ for t in type(seen).__mro__}:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def hub_error(exc: BaseException, what: str, then: str = "") -> HearthError:
    """The one line a person reads for a failed Hub call: ``OFFLINE`` when the Hub could not be reached
    (``is_offline_error``), else ``what``, the error, and ``then`` (a search, a listing and a download say it
    alike)."""
    if is_offline_error(exc):
        return HearthError(OFFLINE)
    return HearthError(f"{what}: {type(exc).__name__}: {exc}{then}")


def probe_endpoint(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Open (and close) one TCP connection to ``endpoint``'s host; raises ``OSError`` when it cannot (no DNS,
    no route, nothing within ``timeout`` seconds)."""
    from urllib.parse import urlsplit

    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout):
        pass


def _proxied() -> bool:
    import os

    return any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"))


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

    def __init__(self, api: Any = None, download: Callable[..., str] | None = None,
                 probe: Callable[[], None] | None = None) -> None:
        self._api = api
        self._download = download
        self._probe = probe  # None: probe the real Hub's endpoint, unless an api was injected (tests)

    @property
    def api(self) -> Any:
        if self._api is None:
            from huggingface_hub import HfApi

            self._api = HfApi()
        return self._api

    def _reachable(self) -> None:
        """Fail fast, with ``OFFLINE``, when the Hub cannot be reached (instead of the client's retries)."""
        probe = self._probe
        if probe is None:
            if self._api is not None or self._download is not None or _proxied():  # a fake api or download
                return  # (tests); or a proxy, which a direct probe would miss
            endpoint = getattr(self.api, "endpoint", None) or "https://huggingface.co"
            probe = lambda: probe_endpoint(endpoint)  # noqa: E731
        try:
            probe()
        except OSError as exc:
            log.info("Hugging Face unreachable: %s", exc)
            raise HearthError(OFFLINE) from exc

    def search(self, query: str, limit: int = 20) -> list[HubModel]:
        """Repositories matching ``query`` that carry GGUF files, most downloaded first. Offline: a
        ``HearthError`` saying so (``OFFLINE``) within seconds."""
        self._reachable()
        try:
            found = self.api.list_models(search=query or None, filter="gguf", sort="downloads", limit=limit)
            return [HubModel(m.id, int(getattr(m, "downloads", 0) or 0)) for m in found]
        except Exception as exc:  # noqa: BLE001 - offline, rate-limited...: one line for the person
            raise hub_error(exc, "Hugging Face search failed") from exc

    def files(self, repo: str) -> list[HubFile]:
        """The repository's GGUF model files (projector files ``mmproj*`` left out), by name."""
        self._reachable()
        try:
            entries = self.api.list_repo_tree(repo, recursive=True)
            out = [HubFile(repo, e.path, getattr(e, "size", None)) for e in entries
                   if str(e.path).lower().endswith(".gguf") and "mmproj" not in str(e.path).lower()]
        except Exception as exc:  # noqa: BLE001
            raise hub_error(exc, f"cannot list files of {repo}") from exc
        return sorted(out, key=lambda f: f.path.lower())

    def download(self, repo: str, filename: str, on_progress: ProgressFn, cancel: threading.Event,
                 dest_dir: Path | None = None) -> Path:
        """Download ``filename`` of ``repo`` into the models folder (resuming a partial download); returns the
        file. Raises ``DownloadCancelled`` when ``cancel`` is set, ``HearthError`` on a network failure (offline:
        ``OFFLINE`` within seconds, as a search)."""
        fn = self._download
        if fn is None:
            from huggingface_hub import hf_hub_download

            fn = hf_hub_download
        self._reachable()
        target = dest_dir or paths.models_dir()
        got = [0]  # bytes received: "resume" is only offered when there is something to resume

        def progress(done: int, total: int | None) -> None:
            got[0] = done
            on_progress(done, total)

        try:
            path = fn(repo_id=repo, filename=filename, local_dir=str(target),
                      tqdm_class=progress_class(progress, cancel))
        except DownloadCancelled:
            raise
        except Exception as exc:  # noqa: BLE001
            again = "try again to resume" if got[0] else "try again"
            raise hub_error(exc, f"download of {repo}/{filename} failed", f"; {again}") from exc
        return Path(path)
