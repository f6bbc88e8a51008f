"""llama.cpp's side of a load: ``Llama(...)`` arguments, a context of several sequences in a non-unified KV
cache, llama.cpp's log lines routed to Python logging, and the process's peak memory."""

from __future__ import annotations

import logging
import resource
import sys
from typing import Any

from app.catalog.memory_estimate import logit_rows
from app.childhost import default_threads
from app.protocol.types import LoadSettings

GGML_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}  # ggml_type enum values (ggml.h)

_LOG_CALLBACK = None  # keep the ctypes callback alive for the life of the process


def route_llama_logs() -> None:
    """Send llama.cpp's log lines to Python logging (logger ``llama.cpp``) instead of stderr: errors as
    warnings, everything else at debug level (``hearth -v`` shows them). llama-cpp-python 0.3.36 maps ggml's log
    levels with an old enum (DEBUG=1, INFO=2, WARN=3, ERROR=4 in this llama.cpp) and prints informational
    warnings such as "using full-size SWA cache" on every load."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is not None:
        return
    import ctypes

    import llama_cpp

    llog = logging.getLogger("llama.cpp")

    @llama_cpp.llama_log_callback
    def _cb(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        msg = text.decode("utf-8", "replace").rstrip()
        if msg:
            llog.log(logging.WARNING if level == 4 else logging.DEBUG, "%s", msg)

    _LOG_CALLBACK = _cb
    llama_cpp.llama_log_set(_cb, ctypes.c_void_p(0))


def llama_kwargs(settings: LoadSettings) -> dict[str, Any]:
    """``Llama(...)`` keyword arguments for ``settings`` (llama-cpp-python 0.3.36 names; it silently ignores
    unknown ones, so every name here is checked by a test). ``n_gpu_layers`` and ``offload_kqv`` take effect in a
    CUDA or Metal build (``make run BACKEND=cuda|metal``) and are ignored by a CPU build."""
    threads = settings.n_threads or default_threads()
    return dict(n_ctx=settings.n_ctx, n_batch=decode_capacity(settings), n_ubatch=settings.n_ubatch,
                n_threads=threads, n_threads_batch=threads, n_gpu_layers=settings.n_gpu_layers,
                type_k=GGML_TYPES[settings.type_k], type_v=GGML_TYPES[settings.type_v],
                flash_attn=settings.flash_attn, offload_kqv=settings.offload_kqv,
                use_mmap=settings.use_mmap, use_mlock=settings.use_mlock, swa_full=settings.swa_full,
                logits_all=False, verbose=False, seed=settings.seed)


def decode_capacity(settings: LoadSettings) -> int:
    """Tokens one ``llama_decode`` of the runtime holds at most: ``max(n_batch, n_ubatch)``. ``n_batch`` is the
    canonical prefill chunk (the prefix cache's unit); ``n_ubatch`` the physical batch, so that consecutive
    chunks of one prompt may share one pass over the weights (``layout.merged_end``). llama.cpp clamps
    n_ubatch to the context's n_batch, so the context gets this as its n_batch."""
    return max(settings.n_batch, settings.n_ubatch)


def outputs_per_decode(n_seq: int) -> int:
    """The most logit rows one ``llama_decode`` of the runtime asks for with ``n_seq`` sequences: a decode step
    where every sequence verifies its most speculative guesses (its pending token and up to
    ``max(LOOKUP_DRAFT, DRAFT_MODEL_DRAFT)`` guesses, or ``HEARTH_SPEC_MAX_DRAFT`` when set, each with logits);
    a prefill asks for one row per sequence and the exactness probe of ``speculation`` for 8 rows of one.
    llama.cpp sizes its compute buffer for this many rows of ``n_vocab`` floats (``n_outputs_max``) and aborts
    on a batch that asks for more (``GGML_ASSERT`` in ``llama_context::output_reserve``)."""
    import os

    from app.engine.local.speculative import DRAFT_MODEL_DRAFT, LOOKUP_DRAFT

    guesses = max(LOOKUP_DRAFT, DRAFT_MODEL_DRAFT)
    env = os.environ.get("HEARTH_SPEC_MAX_DRAFT")
    if env:
        try:
            guesses = max(guesses, int(env))
        except ValueError:
            pass
    return logit_rows(n_seq, guesses)


def _context_with_sequences(n_seq: int):
    """A context manager under which ``llama_cpp.Llama(...)`` creates its context with ``n_seq`` sequences in
    a non-unified KV cache (``n_seq_max``, ``kv_unified=False``: one KV stream of n_ctx / n_seq cells per
    sequence) and room for ``outputs_per_decode(n_seq)`` logit rows per ``llama_decode`` (``n_outputs_max``;
    llama.cpp's default, 0, means n_batch rows: a compute buffer of n_batch × n_vocab floats, 256 MiB for the
    bundled model's 262,144-token vocabulary at n_batch 256, where llama-server reserves one row per slot).
    llama-cpp-python 0.3.36 sets ``n_seq_max`` only for embedding models; its context parameters start from
    ``llama_context_default_params()``, which this wraps for the duration of the load (the engine process
    loads one model, on one thread)."""
    import contextlib

    import llama_cpp.llama_cpp as lib

    n_outputs = outputs_per_decode(n_seq)

    @contextlib.contextmanager
    def patched():
        orig = lib.llama_context_default_params

        def params():
            p = orig()
            p.n_seq_max = n_seq
            p.kv_unified = False
            p.n_outputs_max = n_outputs
            return p

        lib.llama_context_default_params = params
        try:
            yield
        finally:
            lib.llama_context_default_params = orig

    return patched()


def peak_rss_bytes() -> int:
    """Peak resident set size of this process in bytes (``getrusage``; kB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)


RELEASE_MIN_BYTES = 32 << 20  # anonymous mappings smaller than this are left alone (the Python heap's arenas)
_MADV_DONTNEED = 4  # Linux <sys/mman.h>


def release_zero_pages(block: int = 2 << 20, min_bytes: int = RELEASE_MIN_BYTES) -> int:
    """Give the kernel back the all-zero pages of this process's large private anonymous mappings
    (``madvise(MADV_DONTNEED)``, Linux only; elsewhere 0). Returns the bytes released.

    llama.cpp zero-fills the whole KV cache when it creates a context, and clearing it (``llama_memory_clear``
    with data) zero-fills it again, so all of it is resident from the load on: 288 MiB for the bundled model at
    4 slots × 4,096 tokens with the full-size sliding-window cache that exact prefix reuse needs, of which a
    chat touches a few MB. A private anonymous page dropped this way reads as zero again, exactly what it held,
    and becomes resident only when written; a ``block`` (bytes) is released only when every byte of it is zero,
    so the contents of every mapping stay the same whatever it is. Call it only while no other thread writes to
    memory (the engine process after its warm-up, before it serves). Measured: docs/engine.md, "Memory"."""
    if not sys.platform.startswith("linux"):
        return 0
    import ctypes

    # PyDLL: the GIL is held through each check and its madvise, so no Python thread writes in between.
    libc = ctypes.PyDLL(None)
    libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    zero = ctypes.create_string_buffer(block)
    released = 0
    for start, end in _anonymous_mappings(min_bytes):
        for at in range(start, end - block + 1, block):
            if libc.memcmp(at, zero, block) == 0 and libc.madvise(at, block, _MADV_DONTNEED) == 0:
                released += block
    return released


def _glibc():
    """This process's C library when it is glibc (``malloc_trim`` present), else None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None)
    return libc if hasattr(libc, "malloc_trim") else None


def trim_heap() -> bool:
    """Return the C heap's free pages to the kernel (glibc's ``malloc_trim(0)``, which also releases free pages
    inside the heap, not only at its top; elsewhere False). glibc raises its mmap threshold to the largest
    block freed (up to 32 MiB), so transient buffers such as the disk cache's KV state land in the heap, and a
    small block allocated after one keeps its pages resident. A few ms for a few hundred MB of heap: call it
    while idle. True when memory was released."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def _anonymous_mappings(min_bytes: int) -> list[tuple[int, int]]:
    """(start, end) addresses of this process's private, readable and writable anonymous mappings of at least
    ``min_bytes``, from ``/proc/self/maps`` (no file, no ``[heap]``/``[stack]``)."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if len(parts) < 5 or parts[1] != "rw-p" or parts[4] != "0" or len(parts) > 5:
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        if end - start >= min_bytes:
            out.append((start, end))
    return out
