"""The embedding engine: a child process that owns ``Llama(model_path, embedding=True)``.

Why a process: llama.cpp can abort the whole process on some inputs or files (an unexpected tensor type, a
bad batch setting); in a child, that is an ``EngineCrashed`` error for the caller, not a dead app. The child is
hosted by ``app.engine.process.ChildHost``, like the chat engine: the same wire protocol, timeouts, parent
watch (a child whose parent died exits quietly), OpenMP setting and thread policy
(``default_threads(background=True)``). It restarts on the next request after a crash. Requests are
serialised by a lock (one ``Llama`` must never be used from two threads at once).

Settings (see docs/llama-cpp-notes.md): ``n_batch == n_ubatch`` (embedding with ``n_ubatch < n_batch`` aborts)
and both equal ``n_ctx`` so that one chunk always fits one batch; llama-cpp-python truncates an input longer
than ``n_batch`` tokens, and ``chunking`` keeps chunks far below that. ``verbose=False`` silences the child's
stdout/stderr while the model loads.

Requests (main lane): ``("embed", [str])`` → float32 bytes, ``("tokenize", [str])`` → token counts.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.process import ChildHost, Timeouts, default_threads
from app.errors import EngineCrashed, HearthError, ModelLoadError

log = logging.getLogger(__name__)

DEFAULT_N_CTX = 512  # tokens; all-MiniLM-L6-v2 has 512 positions
_BATCH_TEXTS = 64  # texts per request: bounds the size of one message and one llama.cpp call


def model_id_for(path: Path) -> str:
    """A stable identity for an embedding model file: ``<stem>@<12 hex>`` of a sha256 over its size and its
    first and last MiB (cheap for big files, and it changes whenever the weights do)."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(-(1 << 20), 2)
            h.update(f.read())
    return f"{path.stem}@{h.hexdigest()[:12]}"


@dataclass(frozen=True)
class EmbedderInfo:
    """What the child reports after loading: ``dim`` (vector length), ``n_ctx`` (context, tokens)."""

    dim: int
    n_ctx: int


class Embedder:
    """Handle on the embedding child process. ``embed(texts) -> float32 (n, dim)`` L2-normalised vectors;
    ``count_tokens(texts)`` counts tokens without special tokens (a ``chunking.TokenCounter``).

    ``n_threads``: CPU threads (default ``default_threads(background=True)``); ``start_timeout_s``: seconds
    to wait for the model to load; ``request_timeout_s``: seconds a request may go unanswered (a hung child is
    killed and reported as crashed). Both default to the one policy of ``app.engine.process.Timeouts``."""

    def __init__(self, model_path: Path | str, n_ctx: int = DEFAULT_N_CTX, n_threads: int | None = None,
                 start_timeout_s: float = Timeouts.start_s, request_timeout_s: float = Timeouts.reply_s) -> None:
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ModelLoadError(f"embedding model not found: {self.model_path}", path=str(self.model_path))
        self.model_id = model_id_for(self.model_path)
        self.name = f"llama.cpp:{self.model_id}"  # TokenCounter name
        self.n_ctx = n_ctx
        self.n_threads = n_threads or default_threads(background=True)
        self.host = ChildHost("hearth-embedder", _EmbedService.load, (str(self.model_path), n_ctx, self.n_threads),
                              label="the embedding engine", model_path=str(self.model_path),
                              timeouts=Timeouts(start_timeout_s, request_timeout_s))
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------ public API

    @property
    def info(self) -> EmbedderInfo:
        """``dim`` and ``n_ctx`` of the loaded model (starts the child if needed)."""
        with self._lock:
            return self.host.start()

    @property
    def dim(self) -> int:
        return self.info.dim

    @property
    def pid(self) -> int | None:
        """Process id of the child (None when none runs)."""
        return self.host.pid

    def embed(self, texts: list[str]) -> np.ndarray:
        """L2-normalised float32 vectors, shape ``(len(texts), dim)``. Raises ``EngineCrashed``,
        ``ModelLoadError``."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = []
        for i in range(0, len(texts), _BATCH_TEXTS):
            raw = self._request("embed", list(texts[i:i + _BATCH_TEXTS]))
            parts.append(np.frombuffer(raw, dtype=np.float32).reshape(-1, self.dim))
        return np.vstack(parts)

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens of each text under the model's tokenizer, without special tokens."""
        if not texts:
            return []
        out: list[int] = []
        for i in range(0, len(texts), 1024):
            out.extend(self._request("tokenize", list(texts[i:i + 1024])))
        return out

    def crash_for_test(self) -> EngineCrashed:
        """Make the child abort mid-request as llama.cpp does on a fatal error; returns the error it caused."""
        with self._lock:
            return self.host.crash_for_test()

    def close(self) -> None:
        """Stop the child (politely, then by force) once the request in progress is answered. A later request
        starts a new one."""
        with self._lock:
            self.host.stop()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # best effort: never leave a child behind
        try:
            self.host.close()
        except Exception:  # noqa: BLE001
            pass

    def _request(self, op: str, payload: Any) -> Any:
        with self._lock:
            return self.host.request(op, payload)


# ------------------------------------------------------------------------------------------- child process

class _EmbedService:
    """The child's ``Handler``: one ``Llama(embedding=True)``; main lane only."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    @classmethod
    def load(cls, model_path: str, n_ctx: int, n_threads: int) -> "_EmbedService":
        """Runs in the child. Raises ``ModelLoadError``."""
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ModelLoadError("llama-cpp-python is not installed", path=model_path) from exc
        try:
            return cls(Llama(model_path=model_path, embedding=True, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                             n_threads=n_threads, n_threads_batch=n_threads, verbose=False))
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelLoadError(f"llama.cpp could not load the embedding model: {exc}", path=model_path) from exc

    def ready_info(self) -> EmbedderInfo:
        return EmbedderInfo(dim=self.llm.n_embd(), n_ctx=self.llm.n_ctx())

    def call(self, op: str, args: tuple, emit: Any, cancelled: Any) -> Any:
        (texts,) = args
        if op == "tokenize":
            return [len(self.llm.tokenize(t.encode("utf-8"), add_bos=False)) for t in texts]
        if op == "embed":
            vectors = np.asarray(self.llm.embed(texts, normalize=False, truncate=True), dtype=np.float32)
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            return (vectors / np.maximum(norms, 1e-12)).astype(np.float32).tobytes()
        raise HearthError(f"unknown embedding request {op!r}")

    def side(self, op: str, args: tuple) -> Any:
        raise HearthError("the embedding engine has no side lane")
