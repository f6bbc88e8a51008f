"""How much memory a model needs under given load settings, and whether it fits, before loading it.

All sizes are bytes; context sizes are tokens (KV "cells"). Weights, KV cache, compute buffer and parallel
sequences are counted as llama.cpp allocates them; the verdict against the available memory is "fits",
"tight", "won't fit" or "unknown" (``FITS_FRACTION``).

The reasoning: docs/engine.md, 'app/catalog/memory_estimate.py'.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import gguf

from app.catalog.gguf import ModelInfo
from app.protocol.types import LoadSettings

log = logging.getLogger(__name__)

FITS_FRACTION = 0.8            # "fits" up to this share of the available memory; "tight" up to 1.0
OVERHEAD_BYTES = 64 << 20      # fixed margin: ggml contexts, thread scratch, the Python side of the engine
CTX_PAD = 256                  # llama_context pads n_ctx to a multiple of this (tokens)
VERDICTS = ("fits", "tight", "won't fit", "unknown")


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated memory for one model + ``LoadSettings``; bytes unless the name says otherwise.

    ``kv_cells``: cells (tokens) of the non-SWA layers (n_ctx padded to 256); ``swa_cells``: cells of each
    SWA layer (0 when none). ``kv_bytes_per_token``: K+V bytes of one token across all layers (full cache).
    ``ram_bytes`` / ``vram_bytes``: what must fit in each (all of it in RAM when VRAM is unknown).
    """

    n_ctx: int
    kv_cells: int
    swa_cells: int
    n_swa_layers: int
    gpu_layers: int
    weights_bytes: int
    weights_cpu_bytes: int
    weights_gpu_bytes: int
    kv_k_bytes: int
    kv_v_bytes: int
    kv_bytes: int
    kv_gpu_bytes: int
    kv_bytes_per_token: int
    compute_bytes: int
    overhead_bytes: int
    total_bytes: int
    ram_bytes: int
    vram_bytes: int
    available_ram_bytes: int | None
    available_vram_bytes: int | None
    ram_verdict: str
    vram_verdict: str
    verdict: str
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d


def kv_bytes_per_element(kv_type: str) -> float:
    """Bytes per cached element for a KV type name ("f16" → 2.0, "q8_0" → 34/32, "q4_0" → 18/32)."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kv_type.upper()]]
    return size / block


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def _gpu_layers(info: ModelInfo, n_gpu_layers: int) -> tuple[int, bool, set[int]]:
    """(effective offloaded layers, output layer on GPU, set of block indices on GPU) as llama.cpp does."""
    n_gpu = info.n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, info.n_layer + 1)
    start = max(info.n_layer + 1 - n_gpu, 0)
    return n_gpu, n_gpu >= 1, {il for il in range(info.n_layer) if il >= start}


def _weights(info: ModelInfo, n_gpu_layers: int) -> tuple[int, int, int]:
    """(effective GPU layers, CPU bytes, GPU bytes) of the weights."""
    n_gpu, output_on_gpu, blocks = _gpu_layers(info, n_gpu_layers)
    gpu = sum(info.layer_bytes[il] for il in blocks if il < len(info.layer_bytes))
    if output_on_gpu:
        gpu += info.output_bytes
    cpu = info.tensor_bytes - gpu
    if output_on_gpu and info.output_tied:
        gpu += info.token_embd_bytes  # the tied head is a GPU copy of token_embd
    return n_gpu, cpu, gpu


def _kv_cells(info: ModelInfo, s: LoadSettings) -> tuple[int, int]:
    """(cells of non-SWA layers, cells of SWA layers) per llama_context / llama_kv_cache_iswa."""
    cells = _pad(s.n_ctx, CTX_PAD)
    if not any(info.swa_layers):
        return cells, 0
    if s.swa_full:
        return cells, cells
    return cells, _pad(min(cells, (info.sliding_window or 0) + s.n_ubatch), CTX_PAD)


def _kv(info: ModelInfo, s: LoadSettings, gpu_blocks: set[int]) -> tuple[int, int, int, int]:
    """(K bytes, V bytes, bytes on the GPU, bytes per token of a full cache)."""
    cells, swa_cells = _kv_cells(info, s)
    k_el, v_el = kv_bytes_per_element(s.type_k), kv_bytes_per_element(s.type_v)
    k_total = v_total = gpu = per_token = 0.0
    if info.is_embedding_model:  # encoder-only: llama.cpp creates no KV cache
        return 0, 0, 0, 0
    swa = info.swa_layers
    for il, heads in enumerate(info.kv_heads_per_layer()):
        n = swa_cells if il < len(swa) and swa[il] else cells
        k = n * heads * info.head_dim_k * k_el
        v = n * heads * info.head_dim_v * v_el
        k_total, v_total = k_total + k, v_total + v
        per_token += heads * (info.head_dim_k * k_el + info.head_dim_v * v_el)
        if il in gpu_blocks and s.offload_kqv:
            gpu += k + v
    p = s.n_parallel or 1
    return int(k_total * p), int(v_total * p), int(gpu * p), int(per_token)


SPEC_GUESSES = 10  # guesses a speculative step verifies at most by default (the engine's prompt lookup draft)


def logit_rows(n_seq: int, guesses: int = SPEC_GUESSES) -> int:
    """Logit rows one ``llama_decode`` of Hearth's engine asks for at most with ``n_seq`` sequences, each
    verifying up to ``guesses`` speculative tokens after its pending one (at least 8: the speculation's
    exactness probe). The engine's context reserves exactly this many rows (``n_outputs_max``), not llama.cpp's
    default of one per ubatch token."""
    return max(8, n_seq * (1 + guesses))


def compute_buffer_bytes(info: ModelInfo, s: LoadSettings) -> int:
    """Heuristic compute buffer + logits output buffer in bytes of Hearth's engine context (docs/engine.md,
    'app/catalog/memory_estimate.py'): the largest of its stages, which the allocator overlaps: the logits of
    ``logit_rows`` rows, the attention scores without flash attention, or the layers' activations (5 ×
    n_ubatch × (n_embd + n_ff) floats, measured on Gemma 3 270M: 25.8 MiB at n_ubatch 512, 51.5 at 1024); plus
    the output buffer of one logits row per sequence."""
    rows = min(s.n_ubatch, logit_rows(s.n_parallel or 1))
    logits = info.n_vocab * rows * 4
    n_head = max(info.n_head) if isinstance(info.n_head, tuple) else info.n_head
    scores = 0 if s.flash_attn else n_head * s.n_ubatch * _pad(s.n_ctx, CTX_PAD) * 4
    activations = 5 * s.n_ubatch * (info.n_embd + info.n_ff) * 4
    return max(logits, scores, activations) + info.n_vocab * 4 * (s.n_parallel or 1)


def resolve_parallel(info: ModelInfo, settings: LoadSettings) -> LoadSettings:
    """``settings`` with ``n_parallel`` None (auto) replaced by ``choose_parallel`` (RAM read from the OS), as
    the engine resolves it on load; the one place "auto" is decided (engine, ``hearth inspect``, the window's
    model panel)."""
    if settings.n_parallel is not None:
        return settings
    from dataclasses import replace

    return replace(settings, n_parallel=choose_parallel(info, settings))


DEFAULT_PARALLEL = 4  # sequences served at once where they fit (llama-server's default is 4 slots too)
UNKNOWN_RAM_KV_BYTES = 2 << 30  # with unknown free memory, 4 sequences only when their KV stays under this


def choose_parallel(info: ModelInfo, settings: LoadSettings, available_ram_bytes: int | None = None,
                    available_vram_bytes: int | None = None, *, detect_ram: bool = True) -> int:
    """The default ``n_parallel`` for ``info`` under ``settings`` (an int, 1 … ``DEFAULT_PARALLEL``): the
    largest count whose estimate "fits" (≤ 0.8 × available memory, see ``estimate_memory``). When the
    available memory is unknown: ``DEFAULT_PARALLEL`` if that many sequences' KV is under 2 GiB, else 1."""
    from dataclasses import replace

    for p in range(DEFAULT_PARALLEL, 0, -1):
        est = estimate_memory(info, replace(settings, n_parallel=p), available_ram_bytes, available_vram_bytes,
                              detect_ram=detect_ram)
        if est.verdict == "fits":
            return p
        if est.verdict == "unknown":
            return p if est.kv_bytes <= UNKNOWN_RAM_KV_BYTES else 1
        detect_ram = False
        available_ram_bytes = est.available_ram_bytes
    return 1


def _verdict(need: int, available: int | None) -> str:
    if available is None:
        return "unknown"
    if need <= FITS_FRACTION * available:
        return "fits"
    return "tight" if need <= available else "won't fit"


def _worst(*verdicts: str) -> str:
    order = {"won't fit": 3, "tight": 2, "unknown": 1, "fits": 0}
    return max(verdicts, key=order.__getitem__)


def estimate_memory(info: ModelInfo, settings: LoadSettings, available_ram_bytes: int | None = None,
                    available_vram_bytes: int | None = None, *, detect_ram: bool = True) -> MemoryEstimate:
    """Estimate the memory ``info`` needs when loaded with ``settings`` (validated first: raises
    ``InvalidRequest``). ``available_ram_bytes``: None reads it from the OS (``detect_available_ram``)
    unless ``detect_ram=False``. ``available_vram_bytes``: free GPU memory when the backend reports it
    (e.g. ``available_vram_bytes()``); None counts everything against RAM."""
    s = settings.validate()
    n_gpu, w_cpu, w_gpu = _weights(info, s.n_gpu_layers)
    _, _, gpu_blocks = _gpu_layers(info, s.n_gpu_layers)
    k, v, kv_gpu, per_token = _kv(info, s, gpu_blocks)
    cells, swa_cells = _kv_cells(info, s)
    compute = compute_buffer_bytes(info, s)
    total = w_cpu + w_gpu + k + v + compute + OVERHEAD_BYTES
    if available_ram_bytes is None and detect_ram:
        available_ram_bytes = detect_available_ram()
    if available_vram_bytes is None:
        ram, vram = total, 0
    else:
        compute_gpu = compute if n_gpu > 0 else 0
        vram = w_gpu + kv_gpu + compute_gpu
        ram = total - vram
    ram_v = _verdict(ram, available_ram_bytes)
    vram_v = _verdict(vram, available_vram_bytes) if vram else "fits"
    return MemoryEstimate(
        n_ctx=s.n_ctx, kv_cells=cells, swa_cells=swa_cells, n_swa_layers=sum(info.swa_layers),
        gpu_layers=n_gpu, weights_bytes=info.tensor_bytes, weights_cpu_bytes=w_cpu, weights_gpu_bytes=w_gpu,
        kv_k_bytes=k, kv_v_bytes=v, kv_bytes=k + v, kv_gpu_bytes=kv_gpu, kv_bytes_per_token=per_token,
        compute_bytes=compute, overhead_bytes=OVERHEAD_BYTES, total_bytes=total, ram_bytes=ram,
        vram_bytes=vram, available_ram_bytes=available_ram_bytes, available_vram_bytes=available_vram_bytes,
        ram_verdict=ram_v, vram_verdict=vram_v if available_vram_bytes is not None else "unknown",
        verdict=_worst(ram_v, vram_v), notes=_notes(info, s),
    )


def _notes(info: ModelInfo, s: LoadSettings) -> tuple[str, ...]:
    notes = []
    if info.context_length and s.n_ctx > info.context_length:
        notes.append(f"n_ctx {s.n_ctx} is above the trained context of {info.context_length} tokens")
    if info.sliding_window and not info.swa_layers:
        notes.append("sliding-window layer pattern unknown: every layer counted with the full context")
    if any(info.swa_layers) and not s.swa_full:
        notes.append("swa_full=False: sliding-window layers keep only the window; prefixes shorter than the "
                     "cached text cannot be reused exactly")
    return tuple(notes)


# ------------------------------------------------------------------------------- available memory


def detect_available_ram() -> int | None:
    """Memory (bytes) the OS can give a new process without swapping, or None if unknown.

    Linux: ``MemAvailable`` of /proc/meminfo (free + reclaimable cache). Other POSIX: free pages from
    ``os.sysconf("SC_AVPHYS_PAGES")`` (ignores reclaimable cache: an under-estimate). macOS: ``sysctl -n
    hw.memsize``, the *total* RAM (macOS has no cheap "available" figure; an over-estimate).
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if sys.platform == "darwin":
        return _run_int(["sysctl", "-n", "hw.memsize"])
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def available_vram_bytes() -> int | None:
    """Free memory (bytes) summed over the NVIDIA GPUs that ``nvidia-smi`` reports (llama.cpp splits layers
    across all of them by default), or None: no nvidia-smi, an error, or no answer within 3 s."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = _run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"])
    if not out:
        return None
    try:
        return sum(int(float(x)) for x in out.split()) * (1 << 20)  # MiB
    except ValueError:
        return None


def _run(cmd: list[str]) -> str | None:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=3, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("%s failed: %s", cmd[0], exc)
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def _run_int(cmd: list[str]) -> int | None:
    out = _run(cmd)
    try:
        return int(out) if out else None
    except ValueError:
        return None
