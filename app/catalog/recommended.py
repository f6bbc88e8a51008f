"""The curated list of instruction-tuned models (``app/data/recommended_models.json``) sized to this machine.

Qt-free. Each entry states only what is known, never a guess; ``fit`` judges it with the memory estimate.
``for_machine`` orders the whole list for one machine (those that fit first, largest first; those too large
last, marked so); ``recommend`` is its head.

The reasoning: docs/ui.md, 'app/catalog/recommended.py'.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gguf

from app.catalog.memory_estimate import FITS_FRACTION

CPU_MAX_FILE_BYTES = 5_500_000_000  # ~8B parameters at Q4_K_M (Qwen3 8B: about 5.0 GB): still usable on a CPU
FIT_N_CTX = 4096
CATALOG = Path(__file__).resolve().parents[1] / "data" / "recommended_models.json"
# llama.cpp's type names: file types (Q4_K_M, IQ4_XS, ...) and tensor types (MXFP4, Q8_0, ...).
QUANT_NAMES = frozenset(
    {n.split("_", 1)[1] for n in gguf.LlamaFileType.__members__ if n.startswith(("MOSTLY_", "ALL_"))}
    | set(gguf.GGMLQuantizationType.__members__)) - {"MXFP4_MOE", "I8", "I16", "I32", "I64", "F64"}
# Average bits per weight of the mixes (llama.cpp keeps some tensors at higher precision): from the sizes
# `llama-quantize --help` lists for Llama-3-8B (e.g. Q4_K_M 4.58 GiB for 8.03 B weights). Other types: the
# block size of the base type (gguf.GGML_QUANT_SIZES).
MIX_BPW = {"Q4_K_M": 4.89, "Q4_K_S": 4.67, "Q5_K_M": 5.70, "Q5_K_S": 5.57, "Q3_K_M": 3.91, "Q6_K": 6.56,
           "Q8_0": 8.50, "Q4_0": 4.55, "MXFP4": 4.65}


def resources_dir() -> Path:
    """``resources/`` next to the package (source tree) or inside a PyInstaller bundle (icons)."""
    base = getattr(sys, "_MEIPASS", None)
    if base:
        return Path(base) / "resources"
    return Path(__file__).resolve().parents[2] / "resources"


def quantization_from_name(file_name: str) -> str:
    """``Qwen3-4B-Instruct-2507-Q4_K_M.gguf`` → ``Q4_K_M``; ``gpt-oss-20b-mxfp4.gguf`` → ``MXFP4``; a name
    whose last ``-``/``.`` part is not a llama.cpp type (``model-q4km.gguf``, ``x-UD-Q4_K_XL.gguf``) →
    ``unknown``."""
    stem = file_name[:-5] if file_name.lower().endswith(".gguf") else file_name
    last = stem.replace(".", "-").rsplit("-", 1)[-1].upper()
    return last if last in QUANT_NAMES else "unknown"


def bits_per_weight(quant: str) -> float | None:
    """Average bits per weight of a file quantized as ``quant`` (None for "unknown")."""
    if quant in MIX_BPW:
        return MIX_BPW[quant]
    base = quant.rsplit("_", 1)[0] if quant.endswith(("_S", "_M", "_L", "_XS", "_XXS")) else quant
    for name in (quant, base, base + "_K" if "_K" not in base else base):
        if name in gguf.GGMLQuantizationType.__members__:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
            return size * 8 / block
    return None


@dataclass(frozen=True)
class Recommendation:
    """One curated model and its verdict on this machine ("fits" / "tight" / "won't fit" / "unknown").

    ``size_bytes``: the exact file size, None when not known; ``min_memory_bytes``: the estimated memory on
    the device it fits best (``where``: "GPU" / "CPU"), None before ``fit`` or when unknown;
    ``quantization``: from the file name or "unknown"; ``size_estimated``: the weights in the estimate come
    from parameters × bits per weight, not a known size; ``slow``: set by ``fit`` when the machine has no GPU
    and the weights exceed ``CPU_MAX_FILE_BYTES`` (it fits in RAM but answers at a few tokens per second)."""

    id: str
    name: str
    repo: str
    file: str
    size_bytes: int | None
    min_memory_bytes: int | None
    blurb: str
    license: str
    verdict: str = "unknown"
    params: int | None = None
    context_length: int | None = None
    shape: dict[str, int] = field(default_factory=dict, compare=False, hash=False, repr=False)
    quantization: str = "unknown"
    where: str | None = None
    size_estimated: bool = False
    slow: bool = False

    def weights_bytes(self) -> int | None:
        """The file size, else parameters × bits per weight, else None."""
        if self.size_bytes:
            return self.size_bytes
        bpw = bits_per_weight(self.quantization)
        return int(self.params * bpw / 8) if self.params and bpw else None

    def size_text(self) -> str:
        """The download size in GiB: "2.3 GiB" (the file's listed size), "about 4.6 GiB (estimated from
        parameters)" (no listed size: parameters × bits per weight), or "size not listed" (neither)."""
        if self.size_bytes:
            return _gib(self.size_bytes)
        est = self.weights_bytes()
        return f"about {_gib(est)} (estimated from parameters)" if est else "size not listed"

    def fit_text(self) -> str:
        """The verdict in plain words, with where and the memory it needs (GiB, at ``FIT_N_CTX`` tokens of
        context): "Fits in RAM: needs about 5.5 GiB", "Too large for this machine: needs about 14.9 GiB", ..."""
        if self.min_memory_bytes is None or self.verdict == "unknown":
            return "Fit on this machine not known"
        need = f"needs about {_gib(self.min_memory_bytes)}"
        place = "GPU memory" if self.where == "GPU" else "RAM"
        if self.verdict == "won't fit":
            return f"Too large for this machine: {need}"
        fits = "Fits" if self.verdict == "fits" else "Only just fits"
        slow = ", but slow without a GPU" if self.slow else ""
        return f"{fits} in {place}{slow}: {need}"

    def label(self) -> str:
        """The line a list shows: name, quantization, size, licence, verdict (and where), blurb."""
        where = f" on {self.where}" if self.where and self.verdict in ("fits", "tight") else ""
        return (f"{self.name} · {self.quantization if self.quantization != 'unknown' else 'quantization unknown'}"
                f" · {self.size_text()} · {self.license} · {self.verdict}{where} — {self.blurb}")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def load_catalog(path: Path | None = None) -> list[Recommendation]:
    """The curated models from the data file (``path`` overrides), each with its quantization read from the
    file name; not yet judged against a machine."""
    data = json.loads((path or CATALOG).read_text(encoding="utf-8"))
    names = set(Recommendation.__dataclass_fields__) - {"quantization", "verdict", "where", "size_estimated", "slow"}
    out = []
    for m in data["models"]:
        r = Recommendation(**{"min_memory_bytes": None, **{k: m[k] for k in names if k in m}},
                           quantization=quantization_from_name(m["file"]))
        out.append(replace(r, size_estimated=not r.size_bytes and r.weights_bytes() is not None))
    return out


def _info(r: Recommendation, weights: int) -> Any:
    """A header-less ``ModelInfo`` for ``r``'s shape and weights (layers share the weights evenly)."""
    from app.catalog.gguf import ModelInfo

    s = r.shape
    n_layer = int(s["n_layer"])
    return ModelInfo(
        path="", file_name=r.file, size_bytes=weights, architecture="unknown", name=r.name, general_type=None,
        gguf_version=3, parameter_count=r.params or 0, tensor_count=0, tensor_bytes=weights, file_type=None,
        quantization=r.quantization, n_layer=n_layer, n_embd=int(s["n_embd"]), n_ff=int(s["n_ff"]),
        n_head=int(s["n_head"]), n_head_kv=int(s["n_head_kv"]), head_dim_k=int(s["head_dim"]),
        head_dim_v=int(s["head_dim"]), sliding_window=None, swa_pattern=None, swa_layers=(),
        context_length=r.context_length, n_vocab=int(s["n_vocab"]), chat_template=None, bos_token_id=None,
        eos_token_id=None, pooling_type=None, is_embedding_model=False,
        layer_bytes=tuple([weights // n_layer] * n_layer), output_bytes=0)


def fit(r: Recommendation, ram_bytes: int | None, vram_bytes: int | None = None) -> Recommendation:
    """``r`` judged on a machine with ``ram_bytes`` available and ``vram_bytes`` free (None: unknown / no GPU):
    the better of all layers on the GPU and all on the CPU (docs/ui.md, 'app/catalog/recommended.py')."""
    from app.catalog.memory_estimate import estimate_memory
    from app.protocol.types import LoadSettings

    weights = r.weights_bytes()
    if weights is None or not r.shape:
        return replace(r, verdict="unknown", min_memory_bytes=None, where=None, slow=False)
    info = _info(r, weights)
    tries = []
    if vram_bytes:
        gpu = estimate_memory(info, LoadSettings(n_ctx=FIT_N_CTX, n_parallel=1, n_gpu_layers=-1), ram_bytes,
                              vram_bytes, detect_ram=False)
        tries.append((gpu.vram_verdict if ram_bytes is None else gpu.verdict, gpu.vram_bytes, "GPU"))
    cpu = estimate_memory(info, LoadSettings(n_ctx=FIT_N_CTX, n_parallel=1, n_gpu_layers=0), ram_bytes, None,
                          detect_ram=False)
    tries.append((cpu.verdict, cpu.ram_bytes, "CPU"))
    order = {"fits": 0, "tight": 1, "won't fit": 2, "unknown": 3}
    verdict_, need, where = min(tries, key=lambda t: order[t[0]])
    return replace(r, verdict=verdict_, min_memory_bytes=need, where=where,
                   slow=not vram_bytes and weights > CPU_MAX_FILE_BYTES)


def verdict(need: int, available: int | None) -> str:
    """"fits" when ``need`` ≤ 0.8 × ``available``, "tight" up to all of it, else "won't fit"; "unknown"
    without a figure (the same rule as ``app.catalog.memory_estimate``)."""
    if not available:
        return "unknown"
    if need <= FITS_FRACTION * available:
        return "fits"
    return "tight" if need <= available else "won't fit"


def _rank(r: Recommendation) -> tuple[int, int]:
    """The order of ``for_machine``: fits, only just fits, slow on a CPU (each largest first), too large
    (smallest first), not known (the data file's order: ``sorted`` is stable)."""
    need = r.min_memory_bytes or 0
    if r.verdict in ("fits", "tight"):
        return (2 if r.slow else 0 if r.verdict == "fits" else 1), -need
    return (3, need) if r.verdict == "won't fit" else (4, 0)


def for_machine(catalog: list[Recommendation], ram_bytes: int | None,
                vram_bytes: int | None = None) -> list[Recommendation]:
    """Every model of ``catalog`` judged on a machine with ``ram_bytes`` available and ``vram_bytes`` free
    (bytes; None: unknown / no GPU): those that fit first, largest first (on a bigger machine the better model
    is the one to try), then those that only just fit, then those too slow without a GPU, then those too large
    (smallest first), then those that cannot be judged."""
    return sorted((fit(r, ram_bytes, vram_bytes) for r in catalog), key=_rank)


def recommend(catalog: list[Recommendation], ram_bytes: int | None, vram_bytes: int | None = None,
              limit: int = 4) -> list[Recommendation]:
    """Up to ``limit`` models for this machine (``ram_bytes``, ``vram_bytes`` as ``for_machine``): those
    that fit, largest first, none slow on a CPU; if none fits, the smallest."""
    ranked = [r for r in for_machine(catalog, ram_bytes, vram_bytes) if not r.slow]
    fitting = [r for r in ranked if r.verdict == "fits"]
    if fitting:
        return fitting[:limit]
    known = [r for r in ranked if r.min_memory_bytes is not None]
    return sorted(known, key=lambda r: r.min_memory_bytes or 0)[:limit] or ranked[:limit]
