"""The embedding engine: a child process that owns ``Llama(model_path, embedding=True)``.

The reasoning: docs/retrieval.md, 'app/retrieval/embedder.py'.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from app.childhost import ChildHost, Timeouts, default_threads
from app.errors import EngineCrashed, HearthError, InvalidRequest, ModelLoadError

log = logging.getLogger(__name__)

DEFAULT_N_CTX = 512  # tokens per text at most; all-MiniLM-L6-v2 has 512 positions
DEFAULT_BATCH_TOKENS = 512  # tokens per llama_decode on the batched path (measured: see the module docstring)
MAX_WORKERS = 4  # embedding processes at most when the caller gives none (default_workers)
IDLE_NICE = 19  # CPU priority (nice) of the embedding processes after the first
# Seconds without a heartbeat before an embedding process at IDLE_NICE is taken for frozen (docs/engine.md,
# "Watchdog"): on cores kept busy by normal-priority work such a process runs seldom, and while its main thread
# waits for a core holding the GIL its heartbeat thread waits too; the first process keeps Timeouts' default.
IDLE_WATCHDOG_S = 60.0
LEGACY_BATCH_TOKENS = 0  # the path before issue 16: Llama.embed within n_ctx tokens, no flash attention
_BATCH_TEXTS = 64  # texts per request: bounds the size of one message; progress is reported per request too
# Pooling a person may ask for (llama.cpp's enum llama_pooling_type): a chat (decoder) GGUF has none in its
# header and is used as an embedder only with one of these (docs/retrieval.md, "Embedding models").
POOLING_TYPES = {"mean": 1, "cls": 2, "last": 3}


def model_id_for(path: Path, pooling: str | None = None) -> str:
    """A stable identity for an embedding model file: ``<stem>@<12 hex>`` of a sha256 over its size and its
    first and last MiB (cheap for big files, and it changes whenever the weights do), with ``+<pooling>``
    when a pooling override (``POOLING_TYPES``) is given: the same file pooled another way gives other
    vectors."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(-(1 << 20), 2)
            h.update(f.read())
    return f"{path.stem}@{h.hexdigest()[:12]}" + (f"+{pooling}" if pooling else "")


def check_pooling(pooling: str | None) -> str | None:
    """``pooling`` when it is None or a key of ``POOLING_TYPES``; else ``InvalidRequest`` (param ``pooling``)."""
    if pooling is not None and pooling not in POOLING_TYPES:
        raise InvalidRequest(f"pooling must be one of {', '.join(POOLING_TYPES)}, got {pooling!r}",
                             param="pooling")
    return pooling


@dataclass(frozen=True)
class EmbedderInfo:
    """What the child reports after loading: ``dim`` (vector length), ``n_ctx`` (context, tokens)."""

    dim: int
    n_ctx: int


class Embedder:
    """Handle on the embedding child process. ``embed(texts) -> float32 (n, dim)`` L2-normalised vectors;
    ``count_tokens(texts)`` counts tokens without special tokens (a ``chunking.TokenCounter``).

    ``n_ctx``: the most tokens of one text (longer ones are truncated; ``chunking`` keeps chunks far below).
    ``n_threads``: CPU threads (default ``default_threads(background=True)``). ``batch_tokens``: tokens per
    ``llama_decode`` on the batched path (>= ``n_ctx``), or ``LEGACY_BATCH_TOKENS`` (0) for the path before
    issue 16 (see the module docstring). ``flash_attn``: None = on for the batched path, off for the legacy
    one. ``start_timeout_s``: seconds to wait for the model to load; ``request_timeout_s``: seconds a request
    may go unanswered (a hung child is killed and reported as crashed). Both default to the one policy of
    ``app.childhost.host.Timeouts``. ``workers``: embedding child processes of ``n_threads`` threads each
    (None: ``default_workers(n_threads)``, 2 on a 2-core machine); with more than one, ``embed`` splits a
    call's texts into contiguous parts embedded at once (independent processes do not stall each other at
    OpenMP barriers the way threads of one child do on a busy core). The first child runs at normal priority
    (queries, token counting: ``host``, ``pid``); the others start on the first call that
    has work for them and run at the lowest CPU priority (``nice`` 19 where the OS has it), so they take idle
    cores only and the chat engine's threads keep theirs. ``pooling``: None (the model's own, from its
    header) or a key of ``POOLING_TYPES`` (how a chat GGUF becomes an embedder; it is part of ``model_id``).
    Raises ``ModelLoadError`` (no such file), ``InvalidRequest`` (an unknown ``pooling``) and ``ValueError``
    (``batch_tokens`` < 0, ``workers`` < 1)."""

    def __init__(self, model_path: Path | str, n_ctx: int = DEFAULT_N_CTX, n_threads: int | None = None,
                 start_timeout_s: float = Timeouts.start_s, request_timeout_s: float = Timeouts.reply_s, *,
                 batch_tokens: int = DEFAULT_BATCH_TOKENS, flash_attn: bool | None = None,
                 workers: int | None = None, pooling: str | None = None) -> None:
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ModelLoadError(f"embedding model not found: {self.model_path}", path=str(self.model_path))
        if batch_tokens < 0:
            raise ValueError(f"batch_tokens must be 0 (legacy path) or a number of tokens > 0, got {batch_tokens}")
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.pooling = check_pooling(pooling)
        self.model_id = model_id_for(self.model_path, pooling)
        self.name = f"llama.cpp:{self.model_id}"  # TokenCounter name
        self.n_ctx = n_ctx
        self.batch_tokens = batch_tokens
        self.flash_attn = bool(batch_tokens) if flash_attn is None else flash_attn
        self.n_threads = n_threads or default_threads(background=True)
        self.workers = workers = workers or default_workers(self.n_threads)
        self.hosts = [ChildHost(f"hearth-embedder{'' if k == 0 else k}", _EmbedService.load,
                                (str(self.model_path), n_ctx, self.n_threads, batch_tokens, self.flash_attn,
                                 0 if k == 0 else IDLE_NICE, POOLING_TYPES.get(pooling or "", -1)),
                                label="the embedding engine", model_path=str(self.model_path), side_lane=k == 0,
                                timeouts=Timeouts(start_timeout_s, request_timeout_s,
                                                  Timeouts.unresponsive_s if k == 0 else IDLE_WATCHDOG_S))
                      for k in range(workers)]
        self.host = self.hosts[0]
        self._locks = [threading.Lock() for _ in range(workers)]
        self._lock = self._locks[0]
        self._pool: ThreadPoolExecutor | None = None

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

    def embed(self, texts: list[str], progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """L2-normalised float32 vectors, shape ``(len(texts), dim)``, in the order of ``texts``.
        ``progress(texts_done, tokens_done)`` (counts within this call, special tokens included, summed over
        the workers) is called after each ``llama_decode`` (batched path) or each request of up to 64 texts
        (legacy path), on the caller's thread. Raises ``EngineCrashed``, ``ModelLoadError``."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = _split_balanced(list(texts), self.workers)
        if len(parts) == 1:
            return self._embed_on(0, parts[0], progress)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="hearth-embedder")
        events: queue.Queue = queue.Queue()
        futures = [self._pool.submit(self._embed_on, k, part, lambda n, t, k=k: events.put((k, n, t)))
                   for k, part in enumerate(parts)]
        done = [(0, 0)] * len(parts)
        while True:
            try:
                k, n, t = events.get(timeout=0.05)
                done[k] = (n, t)
                if progress is not None:
                    progress(sum(d[0] for d in done), sum(d[1] for d in done))
            except queue.Empty:
                if all(f.done() for f in futures) and events.empty():
                    break
        return np.vstack([f.result() for f in futures])

    def _embed_on(self, k: int, texts: list[str], progress: Callable[[int, int], None] | None) -> np.ndarray:
        parts = []
        done_texts = done_tokens = 0
        for i in range(0, len(texts), _BATCH_TEXTS):
            with self._locks[k]:
                call = self.hosts[k].call("embed", list(texts[i:i + _BATCH_TEXTS]))
                for _kind, n_texts, n_tokens in call:
                    if progress is not None:
                        progress(done_texts + n_texts, done_tokens + n_tokens)
                raw, n_tokens = call.result
            done_texts += min(_BATCH_TEXTS, len(texts) - i)
            done_tokens += n_tokens
            parts.append(np.frombuffer(raw, dtype=np.float32).reshape(-1, self.dim))
        return np.vstack(parts)

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens of each text under the model's tokenizer, without special tokens. Runs on the side lane: it
        does not wait for an ``embed`` in progress (from another thread)."""
        if not texts:
            return []
        out: list[int] = []
        for i in range(0, len(texts), 1024):
            out.extend(self._side("tokenize", list(texts[i:i + 1024])))
        return out

    def _side(self, op: str, arg: Any) -> Any:
        """A side-lane request, asked once more when the child dies meanwhile (these only read the vocabulary:
        an embedding on the main lane is what crashed it, and the next request restarts it)."""
        try:
            return self.host.side(op, arg)
        except EngineCrashed as exc:
            log.warning("the embedding engine died during %s; asking a new one: %s", op, exc)
            return self.host.side(op, arg)

    def detokenize(self, seqs: list[list[int]]) -> list[str]:
        """The text of each list of token ids under the model's vocabulary (control tokens such as ``[CLS]``
        give no text; invalid UTF-8 is replaced), for ``/v1/embeddings``' token-id input. Side lane, as
        ``count_tokens``. Raises ``InvalidRequest`` (param ``input``) naming the first id outside the
        vocabulary (``input[i][j]``), ``EngineCrashed``."""
        out: list[str] = []
        for i in range(0, len(seqs), 1024):
            got = self._side("detokenize", [list(map(int, s)) for s in seqs[i:i + 1024]])
            if "bad" in got:
                k, j, t = got["bad"]
                raise InvalidRequest(f"token id {t} at input[{i + k}][{j}] is outside the embedding model's "
                                     f"vocabulary (0 to {got['n_vocab'] - 1})", param="input")
            out.extend(got["texts"])
        return out

    def close(self) -> None:
        """Stop the children (politely, then by force) once the request in progress is answered. A later
        request starts new ones."""
        for lock, host in zip(self._locks, self.hosts):
            with lock:
                host.stop()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # best effort: never leave a child behind
        for host in getattr(self, "hosts", ()):
            try:
                host.close()
            except Exception:  # noqa: BLE001
                pass


def _lower_priority(nice: int) -> None:
    """Add ``nice`` to this process's CPU niceness, every thread of it: ``os.nice`` changes the calling
    thread's on Linux (threads started later inherit it), so the threads the child host started before the
    model loaded are set one by one from ``/proc/self/task``. Best effort: nothing where the OS has neither."""
    if not hasattr(os, "nice"):
        return
    with contextlib.suppress(OSError):
        target = os.nice(nice)
        for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ():
            with contextlib.suppress(OSError, ValueError):
                os.setpriority(os.PRIO_PROCESS, int(tid), target)


def default_workers(n_threads: int) -> int:
    """Embedding processes for bulk embedding (ingest) when the caller gives none: as many processes of
    ``n_threads`` threads as the foreground thread count holds (``default_threads()``; 2 on a 2-core machine,
    2 x 4 threads on 16 cores), at most ``MAX_WORKERS``. Measured by ``benchmarks.retrieval_perf`` on the idle
    2-core dev machine (168 chunks, 33,025 tokens): one process 8.55 chunks/s, two 13.9 chunks/s; the extra
    ones run at the lowest priority (see ``Embedder``), so a busy machine only loses what it had idle."""
    return max(1, min(MAX_WORKERS, default_threads() // max(1, n_threads)))


def _split_balanced(texts: list[str], n: int) -> list[list[str]]:
    """At most ``n`` contiguous, non-empty parts of ``texts`` whose largest part is as small as it can be
    (characters + 1 per text stand for tokens: the parent does not tokenize): the smallest part size that a
    greedy left-to-right packing fits into ``n`` parts, found by bisection (the linear-partition problem;
    ``[5000, 5000, 1]`` in 2 parts is ``[5000] [5000, 1]``, not ``[5000, 5000] [1]``). [] for no texts."""
    if not texts:
        return []
    n = max(1, min(n, len(texts)))
    w = [len(t) + 1 for t in texts]

    def pack(cap: int) -> list[list[str]]:
        parts: list[list[str]] = [[]]
        size = 0
        for t, x in zip(texts, w):
            if parts[-1] and size + x > cap:
                parts.append([])
                size = 0
            parts[-1].append(t)
            size += x
        return parts

    lo, hi = max(w), sum(w)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(pack(mid)) <= n:
            hi = mid
        else:
            lo = mid + 1
    return pack(lo)


# ------------------------------------------------------------------------------------------- child process

class _EmbedService:
    """The child's ``Handler``: one ``Llama(embedding=True)``; ``embed`` on the main lane, ``tokenize`` on the
    side lane."""

    def __init__(self, llm: Any, batch_tokens: int, n_ctx: int) -> None:
        self.llm = llm
        self.n_ctx = n_ctx
        self.batch_tokens = batch_tokens
        self.batch = None
        if batch_tokens:
            import llama_cpp

            self._lib = llama_cpp
            self.batch = llama_cpp.llama_batch_init(max(batch_tokens, n_ctx), 0, 1)
            self.max_seqs = int(llm.context_params.n_seq_max)
            self.max_tokens = min(n_ctx, int(llm._model.n_ctx_train()) or n_ctx)

    @classmethod
    def load(cls, model_path: str, n_ctx: int, n_threads: int, batch_tokens: int = 0,
             flash_attn: bool = False, nice: int = 0, pooling_type: int = -1) -> "_EmbedService":
        """Runs in the child (``nice``: added to its CPU niceness first, where the OS has ``os.nice``;
        ``pooling_type``: llama.cpp's enum, -1 for the model's own). Raises ``ModelLoadError``."""
        if nice:
            _lower_priority(nice)
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ModelLoadError("llama-cpp-python is not installed", path=model_path) from exc
        # llama.cpp clamps n_ubatch to the context size, and an encoder needs the whole batch in one ubatch
        # ("encoder requires n_ubatch >= n_tokens" aborts): the batched context holds one text of n_ctx tokens
        # or one packed batch, whichever is longer. A BERT model has no KV cache, so this costs no memory
        # beyond the batch's activations.
        n_batch = max(batch_tokens, n_ctx)
        try:
            with _quiet_stderr():
                llm = Llama(model_path=model_path, embedding=True, n_ctx=n_batch, n_batch=n_batch, n_ubatch=n_batch,
                            n_threads=n_threads, n_threads_batch=n_threads, flash_attn=flash_attn,
                            pooling_type=pooling_type, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelLoadError(f"llama.cpp could not load the embedding model: {exc}", path=model_path) from exc
        return cls(llm, batch_tokens, n_ctx)

    def ready_info(self) -> EmbedderInfo:
        return EmbedderInfo(dim=self.llm.n_embd(), n_ctx=self.n_ctx)

    def call(self, op: str, args: tuple, emit: Any, cancelled: Any) -> Any:
        (texts,) = args
        if op == "tokenize":  # the main lane still answers it (an older parent)
            return self.side(op, args)
        if op != "embed":
            raise HearthError(f"unknown embedding request {op!r}")
        if self.batch is None:
            vectors, n_tokens = self.llm.embed(texts, normalize=False, truncate=True, return_count=True)
            vectors = np.asarray(vectors, dtype=np.float32)
        else:
            vectors, n_tokens = self._embed_batched(texts, emit)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return (vectors / np.maximum(norms, 1e-12)).astype(np.float32).tobytes(), int(n_tokens)

    def side(self, op: str, args: tuple) -> Any:
        if op == "detokenize":
            return self._detokenize(args[0])
        if op != "tokenize":
            raise HearthError(f"unknown embedding side request {op!r}")
        (texts,) = args
        return [len(self.llm.tokenize(t.encode("utf-8"), add_bos=False)) for t in texts]

    def _detokenize(self, seqs: list[list[int]]) -> dict[str, Any]:
        """``{"texts": [...]}``, or ``{"bad": (i, j, id), "n_vocab": n}`` for the first id outside the
        vocabulary (llama.cpp does not check ids: one out of range reads past its tables)."""
        n = int(self.llm.n_vocab())
        for i, ids in enumerate(seqs):
            for j, t in enumerate(ids):
                if not 0 <= t < n:
                    return {"bad": (i, j, t), "n_vocab": n}
        return {"texts": [self.llm.detokenize(ids).decode("utf-8", errors="replace") for ids in seqs]}

    def _embed_batched(self, texts: list[str], emit: Any) -> tuple[np.ndarray, int]:
        """Pack the texts, in order, into batches of at most ``batch_tokens`` tokens and ``max_seqs``
        sequences; one ``llama_decode`` and one pooled vector per sequence each."""
        tokens = [self.llm.tokenize(t.encode("utf-8"))[:self.max_tokens] for t in texts]
        out = np.zeros((len(texts), self.llm.n_embd()), dtype=np.float32)
        i = total = 0
        while i < len(tokens):
            j, used = i, 0
            while j < len(tokens) and j - i < self.max_seqs and (
                    j == i or used + len(tokens[j]) <= self.batch_tokens):  # a longer text goes alone
                used += len(tokens[j])
                j += 1
            out[i:j] = self._decode(tokens[i:j])
            total += used
            i = j
            emit("progress", i, total)
        return out, total

    def _decode(self, seqs: list[list[int]]) -> np.ndarray:
        lib, batch, ctx = self._lib, self.batch, self.llm._ctx.ctx
        n = 0
        for s, toks in enumerate(seqs):
            for pos, tok in enumerate(toks):
                batch.token[n] = tok
                batch.pos[n] = pos
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = s
                batch.logits[n] = 1  # every token an output: pooling reads them all
                n += 1
        batch.n_tokens = n
        self.llm._ctx.kv_cache_clear()  # a decoder used as an embedder keeps a KV cache: start each batch empty
        rc = lib.llama_decode(ctx, batch)
        if rc != 0:
            raise HearthError(f"llama_decode failed while embedding ({rc})")
        dim = self.llm.n_embd()
        out = np.empty((len(seqs), dim), dtype=np.float32)
        for s in range(len(seqs)):
            ptr = lib.llama_get_embeddings_seq(ctx, s)
            if not ptr:
                raise HearthError("llama.cpp returned no pooled embedding (is the model's pooling type NONE?)")
            out[s] = np.ctypeslib.as_array(ptr, shape=(dim,))
        return out


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 of the child while the context is created: llama-cpp-python 0.3.36 maps
    llama.cpp's log levels one off (a WARN prints as an error even with ``verbose=False``), and the batched
    context's "n_ctx_seq (2048) > n_ctx_train (512) -- possible training context overflow" is harmless here
    (each sequence is at most ``n_ctx`` tokens; the context is long only to hold a batch). Errors still
    arrive as exceptions."""
    import os
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
