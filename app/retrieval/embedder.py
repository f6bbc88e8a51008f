"""The embedding engine: a child process that owns ``Llama(model_path, embedding=True)``.

Why a process: llama.cpp can abort the whole process on some inputs or files (an unexpected tensor type, a
bad batch setting); in a child, that is an ``EngineCrashed`` error for the caller, not a dead app. The handle
restarts a dead child on the next request. Requests are serialised by a lock (one ``Llama`` must never be used
from two threads at once).

Settings (see /work/shared/LLAMA_CPP_NOTES.md): ``n_batch == n_ubatch`` (embedding with ``n_ubatch < n_batch``
aborts) and both equal ``n_ctx`` so that one chunk always fits one batch; llama-cpp-python truncates an input
longer than ``n_batch`` tokens, and ``chunking`` keeps chunks far below that. ``verbose=False`` silences the
child's stdout/stderr while the model loads.

Protocol over a ``multiprocessing.Pipe``: requests ``("embed", [str])``, ``("tokenize", [str])``,
``("close", None)`` (and ``("_abort", None)``, a test hook that aborts the child like a llama.cpp failure);
replies ``("ok", payload)`` or ``("err", HearthError)``. Vectors travel as float32 bytes.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.errors import EngineCrashed, HearthError, ModelLoadError

log = logging.getLogger(__name__)

DEFAULT_N_CTX = 512  # tokens; all-MiniLM-L6-v2 has 512 positions
_BATCH_TEXTS = 64  # texts per request: bounds the size of one message and one llama.cpp call


def default_threads() -> int:
    """Threads for the embedding engine: half the cores (at least one), for prompt-sized batches too.

    llama-cpp-python's own default for batches is *every* core; measured on the 2-core dev machine while other
    work ran, 2 threads embedded 1.7 chunks/s (182 tokens each) and took 144 ms per query, 1 thread 6.4 chunks/s
    and 3.8 ms: llama.cpp's threads spin-wait for each other, so one busy core stalls them all. Half the cores
    also leaves room for the chat engine and the UI."""
    return max(1, (os.cpu_count() or 2) // 2)


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

    ``n_threads``: CPU threads (default ``default_threads()``); ``start_timeout_s``: seconds to wait for the
    model to load; ``request_timeout_s``: seconds per request (a hung child is killed and reported as
    crashed)."""

    def __init__(self, model_path: Path | str, n_ctx: int = DEFAULT_N_CTX, n_threads: int | None = None,
                 start_timeout_s: float = 120.0, request_timeout_s: float = 600.0) -> None:
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ModelLoadError(f"embedding model not found: {self.model_path}", path=str(self.model_path))
        self.model_id = model_id_for(self.model_path)
        self.name = f"llama.cpp:{self.model_id}"  # TokenCounter name
        self.n_ctx = n_ctx
        self.n_threads = n_threads or default_threads()
        self.start_timeout_s = start_timeout_s
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None
        self.info: EmbedderInfo | None = None

    # ------------------------------------------------------------------------------------------ public API

    @property
    def dim(self) -> int:
        return self._ensure_started().dim

    def embed(self, texts: list[str]) -> np.ndarray:
        """L2-normalised float32 vectors, shape ``(len(texts), dim)``."""
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

    def close(self) -> None:
        """Stop the child (politely, then by force)."""
        with self._lock:
            self._stop()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # best effort: never leave a child behind
        try:
            self._stop()
        except Exception:  # noqa: BLE001
            pass

    # ---------------------------------------------------------------------------------------- internals

    def _ensure_started(self) -> EmbedderInfo:
        with self._lock:
            return self._start_locked()

    def _start_locked(self) -> EmbedderInfo:
        if self._proc is not None and self._proc.is_alive() and self.info is not None:
            return self.info
        self._stop()
        ctx = mp.get_context("spawn")  # no fork: the parent may hold threads, Qt and sqlite handles
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, str(self.model_path), self.n_ctx, self.n_threads),
                           name="hearth-embedder", daemon=True)
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        kind, payload = self._receive(self.start_timeout_s, "loading the embedding model")
        if kind == "err":
            self._stop()
            raise payload
        self.info = payload
        log.info("embedding engine ready: %s (dim %d, n_ctx %d)", self.model_id, payload.dim, payload.n_ctx)
        return payload

    def _request(self, op: str, payload: Any) -> Any:
        with self._lock:
            self._start_locked()
            try:
                self._conn.send((op, payload))
            except (BrokenPipeError, EOFError, OSError) as exc:
                self._stop()
                raise EngineCrashed(f"the embedding engine died ({exc})") from exc
            kind, result = self._receive(self.request_timeout_s, op)
        if kind == "err":
            raise result
        return result

    def _receive(self, timeout_s: float, what: str) -> tuple[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self._conn.poll(0.05):
                    return self._conn.recv()
            except (EOFError, OSError):
                pass
            if not self._proc.is_alive():
                code = self._proc.exitcode
                self._stop()
                raise EngineCrashed(f"the embedding engine died while {what} (exit code {code}); "
                                    "it restarts on the next request")
            if time.monotonic() > deadline:
                self._stop()
                raise EngineCrashed(f"the embedding engine did not answer within {timeout_s:.0f} s ({what})")

    def _stop(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        self.info = None
        if conn is not None:
            try:
                if proc is not None and proc.is_alive():
                    conn.send(("close", None))
            except (BrokenPipeError, EOFError, OSError):
                pass
            conn.close()
        if proc is not None:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)


# ------------------------------------------------------------------------------------------- child process

def _serve(conn, model_path: str, n_ctx: int, n_threads: int | None) -> None:
    """Child main loop: load the model, then answer requests until ``close`` or a closed pipe."""
    import os

    # Short OpenMP spin-waits, as in the chat engine (see app.engine.engine.tune_openmp): a busy core elsewhere
    # must not stall every barrier.
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = "1000"
    try:
        llm = _load(model_path, n_ctx, n_threads)
        conn.send(("ok", EmbedderInfo(dim=llm.n_embd(), n_ctx=llm.n_ctx())))
    except HearthError as exc:
        conn.send(("err", exc))
        return
    while True:
        try:
            op, payload = conn.recv()
        except (EOFError, OSError):
            return
        if op == "close":
            return
        try:
            conn.send(("ok", _handle(llm, op, payload)))
        except HearthError as exc:
            conn.send(("err", exc))
        except Exception as exc:  # noqa: BLE001  (a bug in one request must not kill the engine)
            log.exception("embedding request %s failed", op)
            conn.send(("err", HearthError(f"embedding request failed: {type(exc).__name__}: {exc}")))


def _load(model_path: str, n_ctx: int, n_threads: int | None):
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise ModelLoadError("llama-cpp-python is not installed", path=model_path) from exc
    try:
        return Llama(model_path=model_path, embedding=True, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                     n_threads=n_threads, n_threads_batch=n_threads, verbose=False)
    except (ValueError, RuntimeError, OSError) as exc:
        raise ModelLoadError(f"llama.cpp could not load the embedding model: {exc}", path=model_path) from exc


def _handle(llm, op: str, texts: list[str]) -> Any:
    if op == "_abort":  # test hook: die the way llama.cpp does on a fatal error (SIGABRT)
        os.abort()
    if op == "tokenize":
        return [len(llm.tokenize(t.encode("utf-8"), add_bos=False)) for t in texts]
    if op == "embed":
        vectors = np.asarray(llm.embed(texts, normalize=False, truncate=True), dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return (vectors / np.maximum(norms, 1e-12)).astype(np.float32).tobytes()
    raise HearthError(f"unknown embedding request {op!r}")
