"""Inspect a GGUF model file before llama.cpp ever sees it (``inspect_model`` → ``ModelInfo``).

llama.cpp aborts or fails with one generic line on many bad files; this reads the header first
(``app.catalog.gguf_header``) and raises ``ModelLoadError`` (with ``path``) naming the exact problem
(docs/engine.md "The GGUF header reader" lists them). Also ``file_sha256`` (cached). Units: bytes; context
lengths in tokens.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import gguf

from app import paths
from app.catalog.gguf_header import ArrayInfo, GGUFHeader, TensorInfo, read_gguf_header
from app.errors import ModelLoadError
from app.fileio import atomic_write_text, read_json_file

log = logging.getLogger(__name__)

# Architectures llama.cpp (vendored in llama-cpp-python 0.3.36, src/llama-arch.cpp LLM_ARCH_NAMES) knows.
# gguf 0.19's MODEL_ARCH_NAMES is a subset; these are the names it lacks (checked against the vendored
# source tree when this module was written).
_EXTRA_LLAMA_CPP_ARCHITECTURES = frozenset({
    "bailingmoe3", "cohere2moe", "deepseek32", "deepseek4", "dflash", "dots3note", "eagle3",
    "gemma4-assistant", "glm5-next", "granite_swa", "graniteswitch", "hrm_text", "hy_v3", "hy_v4", "kimi-k3",
    "laguna", "maple", "mellum", "minimax-01", "minimax-m3", "muse-glimmer", "nanbeige", "pockettts",
    "qwen3tts", "qwen4exp", "spark2_5", "talkie",
})
PROJECTOR_ARCHITECTURES = frozenset({"clip"})  # "dummy, only used by llama-quantize" in llama-arch.cpp
SUPPORTED_ARCHITECTURES = (frozenset(gguf.MODEL_ARCH_NAMES.values()) | _EXTRA_LLAMA_CPP_ARCHITECTURES) \
    - PROJECTOR_ARCHITECTURES
# Encoder-only / embedding architectures (llama.cpp builds no KV cache for them: llama-model.cpp
# create_memory returns nullptr for the BERT family and gemma-embedding).
EMBEDDING_ARCHITECTURES = frozenset({
    "bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "neo-bert", "eurobert",
    "modern-bert", "gemma-embedding", "llama-embed", "t5encoder",
})

# Sliding-window layer pattern llama.cpp uses when the GGUF has no ``{arch}.attention.sliding_window_pattern``:
# arch -> (n_pattern, dense_first) as passed to ``load_swa_pattern`` in src/models/<arch>.cpp.
# llama_hparams::set_swa_pattern: n_pattern 0 = all layers SWA, 1 = all dense; otherwise layer il is SWA iff
# (il % n_pattern != 0) when dense_first, else (il % n_pattern < n_pattern - 1), i.e. for gemma3 (6) layers
# 5, 11, 17, ... are global and the other five of every six use the window.
SWA_DEFAULT_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False), "gemma3": (6, False), "gemma3n": (5, False), "gemma-embedding": (6, False),
    "cohere2": (4, False), "cohere2moe": (4, True), "exaone4": (4, False), "exaone-moe": (4, False),
    "afmoe": (4, False), "olmo2": (4, False), "gpt-oss": (2, False), "plamo3": (8, False),
    "smallthinker": (4, True), "mellum": (4, False), "muse-glimmer": (4, False), "laguna": (4, True),
    "modern-bert": (3, True),
}

_GUESSED_FILE_TYPE = 1024     # LLAMA_FTYPE_GUESSED flag


# ------------------------------------------------------------------------------------------ model info


@dataclass(frozen=True)
class ModelInfo:
    """What a GGUF model is, read from its header (no weights are loaded).

    Sizes in bytes; ``context_length`` (trained context) and ``sliding_window`` in tokens. ``n_head`` /
    ``n_head_kv`` are an int or, in GGUFs that vary them per layer, a tuple with one value per layer.
    ``head_dim_k`` / ``head_dim_v``: elements per head (``attention.key_length`` / ``value_length``, else
    n_embd / n_head). ``swa_layers``: per layer, True where llama.cpp uses the sliding window (empty when the
    model has no SWA). ``swa_pattern``: the period used (``sliding_window_pattern`` key, else llama.cpp's
    default for the architecture), None when the GGUF gives a per-layer list or there is no SWA.
    ``tensor_bytes``: total tensor data; ``layer_bytes``: per block ``blk.N.``; ``output_bytes``: the output
    head (``output.*`` and ``output_norm.*``); ``output_tied``: no ``output.weight``, the head reuses
    ``token_embd.weight`` (``token_embd_bytes``; llama.cpp duplicates it when the output layer is offloaded).
    ``sha256``: hex digest, only when asked for (see ``file_sha256``).
    """

    path: str
    file_name: str
    size_bytes: int
    architecture: str
    name: str | None
    general_type: str | None
    gguf_version: int
    parameter_count: int
    tensor_count: int
    tensor_bytes: int
    file_type: int | None
    quantization: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int | tuple[int, ...]
    n_head_kv: int | tuple[int, ...]
    head_dim_k: int
    head_dim_v: int
    sliding_window: int | None
    swa_pattern: int | None
    swa_layers: tuple[bool, ...]
    context_length: int | None
    n_vocab: int
    chat_template: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    pooling_type: int | None
    is_embedding_model: bool
    layer_bytes: tuple[int, ...] = field(repr=False, default=())
    output_bytes: int = 0
    output_tied: bool = False
    token_embd_bytes: int = 0
    sha256: str | None = None

    @property
    def id(self) -> str:
        """The model id used across Hearth: the file name without ``.gguf``."""
        return Path(self.file_name).stem

    def kv_heads_per_layer(self) -> tuple[int, ...]:
        """KV heads of each layer (0 for layers without attention, e.g. recurrent layers of hybrids)."""
        return _per_layer(self.n_head_kv, self.n_layer)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["id"] = self.id
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def _per_layer(value: int | tuple[int, ...], n_layer: int) -> tuple[int, ...]:
    if isinstance(value, tuple):
        return tuple(value[:n_layer]) + (0,) * max(0, n_layer - len(value))
    return (value,) * n_layer


def inspect_model(path: str | os.PathLike[str], *, require_chat: bool = False,
                  with_sha256: bool = False) -> ModelInfo:
    """Read, validate and summarize the GGUF model at ``path``.

    Raises ``ModelLoadError`` (``path`` set) for a file llama.cpp cannot or should not load as a language
    model; with ``require_chat=True`` also for an embedding-only model. ``with_sha256`` hashes the file
    (about 1 s per 250 MB the first time; cached, see ``file_sha256``).
    """
    p = Path(path).expanduser()
    header = read_gguf_header(p)
    arch = _check_architecture(header, p)
    info = _build_info(header, p, arch)
    if info.n_layer <= 0:
        raise ModelLoadError(f"{p.name}: malformed metadata: {arch}.block_count is missing or 0", path=str(p))
    if require_chat and info.is_embedding_model:
        raise ModelLoadError(f"{p.name}: this is an embedding model ({arch}), not a chat model; use it for "
                             "document search instead", path=str(p))
    if with_sha256:
        info = replace(info, sha256=file_sha256(p))
    return info


def _check_architecture(header: GGUFHeader, p: Path) -> str:
    arch = header.metadata.get(gguf.Keys.General.ARCHITECTURE)
    gtype = header.metadata.get(gguf.Keys.General.TYPE)
    if not isinstance(arch, str) or not arch:
        raise ModelLoadError(f"{p.name}: malformed metadata: general.architecture is missing or not a string",
                             path=str(p))
    if arch in PROJECTOR_ARCHITECTURES or gtype in ("mmproj", "clip-vision"):
        raise ModelLoadError(f"{p.name}: this is a multimodal projector (mmproj), not a language model; load "
                             "the language model GGUF it belongs to", path=str(p))
    if gtype == "adapter":
        raise ModelLoadError(f"{p.name}: this is a LoRA adapter, not a model; load its base model",
                             path=str(p))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"{p.name}: unsupported architecture {arch!r}: llama.cpp in llama-cpp-python "
                             "0.3.36 does not know it", path=str(p))
    if not header.tensors:
        raise ModelLoadError(f"{p.name}: the file has no tensors (a vocabulary-only GGUF?)", path=str(p))
    return arch


def _build_info(h: GGUFHeader, p: Path, arch: str) -> ModelInfo:
    m = h.metadata

    def get(template: str, default: Any = None) -> Any:
        return m.get(template.format(arch=arch), default)

    n_layer = _as_int(get(gguf.Keys.LLM.BLOCK_COUNT), 0)
    n_embd = _as_int(get(gguf.Keys.LLM.EMBEDDING_LENGTH), 0)
    n_head = _int_or_layers(get(gguf.Keys.Attention.HEAD_COUNT), 0)
    n_head_kv = _int_or_layers(get(gguf.Keys.Attention.HEAD_COUNT_KV), n_head)
    head_max = max(n_head) if isinstance(n_head, tuple) else n_head
    default_dim = n_embd // head_max if head_max else 0
    window = _as_int(get(gguf.Keys.Attention.SLIDING_WINDOW), 0) or None
    swa_pattern, swa_layers = _swa_layers(arch, n_layer, window, get(gguf.Keys.Attention.SLIDING_WINDOW_PATTERN))
    layer_bytes, output_bytes, tied = _split_bytes(h.tensors, n_layer)
    pooling = _as_int(get(gguf.Keys.LLM.POOLING_TYPE), None)
    return ModelInfo(
        path=str(p), file_name=p.name, size_bytes=p.stat().st_size, architecture=arch,
        name=_as_str(m.get(gguf.Keys.General.NAME)), general_type=_as_str(m.get(gguf.Keys.General.TYPE)),
        gguf_version=h.version, parameter_count=sum(t.n_elements for t in h.tensors),
        tensor_count=len(h.tensors), tensor_bytes=sum(t.n_bytes for t in h.tensors),
        file_type=_as_int(m.get(gguf.Keys.General.FILE_TYPE), None),
        quantization=_quantization(m.get(gguf.Keys.General.FILE_TYPE), h.tensors),
        n_layer=n_layer, n_embd=n_embd, n_ff=_max_int(get(gguf.Keys.LLM.FEED_FORWARD_LENGTH)),
        n_head=n_head, n_head_kv=n_head_kv,
        head_dim_k=_as_int(get(gguf.Keys.Attention.KEY_LENGTH), default_dim),
        head_dim_v=_as_int(get(gguf.Keys.Attention.VALUE_LENGTH), default_dim),
        sliding_window=window, swa_pattern=swa_pattern, swa_layers=swa_layers,
        context_length=_as_int(get(gguf.Keys.LLM.CONTEXT_LENGTH), None),
        n_vocab=_vocab_size(h, get(gguf.Keys.LLM.VOCAB_SIZE)),
        chat_template=_as_str(m.get(gguf.Keys.Tokenizer.CHAT_TEMPLATE)),
        bos_token_id=_as_int(m.get(gguf.Keys.Tokenizer.BOS_ID), None),
        eos_token_id=_as_int(m.get(gguf.Keys.Tokenizer.EOS_ID), None),
        pooling_type=pooling,
        is_embedding_model=arch in EMBEDDING_ARCHITECTURES or bool(pooling),
        layer_bytes=layer_bytes, output_bytes=output_bytes, output_tied=tied,
        token_embd_bytes=sum(t.n_bytes for t in h.tensors if t.name == "token_embd.weight"),
    )


def _as_int(v: Any, default: Any) -> Any:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def _as_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _int_or_layers(v: Any, default: Any) -> int | tuple[int, ...]:
    """An int, or a per-layer tuple (collapsed to an int when every layer has the same value)."""
    if isinstance(v, tuple) and v and all(isinstance(x, int) for x in v):
        return v[0] if len(set(v)) == 1 else tuple(int(x) for x in v)
    return _as_int(v, default)


def _max_int(v: Any) -> int:
    if isinstance(v, tuple) and v:
        return max(int(x) for x in v)
    return _as_int(v, 0)


def _swa_layers(arch: str, n_layer: int, window: int | None,
                pattern: Any) -> tuple[int | None, tuple[bool, ...]]:
    """Which layers use the sliding window, the way llama.cpp decides (``load_swa_pattern``)."""
    if not window:
        return None, ()
    if isinstance(pattern, tuple):
        flags = tuple(bool(x) for x in pattern[:n_layer])
        return None, flags + (False,) * (n_layer - len(flags))
    if isinstance(pattern, int) and not isinstance(pattern, bool):
        period, dense_first = pattern, SWA_DEFAULT_PATTERNS.get(arch, (0, False))[1]
    elif arch in SWA_DEFAULT_PATTERNS:
        period, dense_first = SWA_DEFAULT_PATTERNS[arch]
    else:
        return None, ()  # unknown: treated as all-global (a safe over-estimate of the KV cache)
    return period, tuple(_is_swa(il, period, dense_first) for il in range(n_layer))


def _is_swa(il: int, period: int, dense_first: bool) -> bool:
    """llama_hparams::set_swa_pattern (src/llama-hparams.cpp)."""
    if period == 0:
        return True
    return il % period != 0 if dense_first else il % period < period - 1


def _split_bytes(tensors: tuple[TensorInfo, ...], n_layer: int) -> tuple[tuple[int, ...], int, bool]:
    layers = [0] * max(n_layer, 0)
    output = 0
    has_output_weight = False
    for t in tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < len(layers):
            layers[int(parts[1])] += t.n_bytes
        elif parts[0] in ("output", "output_norm"):
            output += t.n_bytes
            has_output_weight |= t.name == "output.weight"
    return tuple(layers), output, not has_output_weight


def _quantization(file_type: Any, tensors: tuple[TensorInfo, ...]) -> str:
    """"Q4_K_M" etc. from general.file_type (gguf.LlamaFileType); else the type holding most bytes among
    the 2-D+ tensors (1-D norms are kept in F32 whatever the quantization)."""
    if isinstance(file_type, int) and not isinstance(file_type, bool):
        try:
            name = gguf.LlamaFileType(file_type & ~_GUESSED_FILE_TYPE).name
            return "F32" if name == "ALL_F32" else name.removeprefix("MOSTLY_")
        except ValueError:
            pass
    totals: dict[str, int] = {}
    for t in tensors:
        if len(t.shape) >= 2:
            totals[t.type_name] = totals.get(t.type_name, 0) + t.n_bytes
    return max(totals, key=totals.__getitem__) if totals else "unknown"


def _vocab_size(h: GGUFHeader, vocab_key: Any) -> int:
    tokens = h.metadata.get(gguf.Keys.Tokenizer.LIST)
    if isinstance(tokens, ArrayInfo):
        return tokens.count
    if isinstance(tokens, tuple):
        return len(tokens)
    if isinstance(vocab_key, int):
        return vocab_key
    emb = next((t for t in h.tensors if t.name == "token_embd.weight"), None)
    return emb.shape[1] if emb is not None and len(emb.shape) > 1 else 0


# -------------------------------------------------------------------------------------------- sha256


def _sha256_cache_file() -> Path:
    return paths.home() / "cache" / "sha256.json"


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of the file at ``path``, cached in ``<data dir>/cache/sha256.json`` keyed by the
    resolved path, size (bytes) and mtime (ns): an unchanged file is hashed once. The cache is rewritten
    atomically (``app.fileio``); an unreadable cache is ignored."""
    p = Path(path).expanduser().resolve()
    st = p.stat()
    key = str(p)
    cache = _load_cache()
    hit = cache.get(key)
    if isinstance(hit, dict) and hit.get("size") == st.st_size and hit.get("mtime_ns") == st.st_mtime_ns:
        return str(hit["sha256"])
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    cache = _load_cache()  # re-read: another process may have added entries meanwhile
    cache[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    _save_cache(cache)
    return digest


def _load_cache() -> dict[str, Any]:
    try:  # the shared reader: a damaged or 100,000-deep file is a ValueError here, never a RecursionError
        return dict(read_json_file(_sha256_cache_file()))
    except (OSError, ValueError):
        return {}


def _save_cache(cache: dict[str, Any]) -> None:
    target = _sha256_cache_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, json.dumps(cache, indent=1, sort_keys=True), prefix=".sha256-")
    except OSError as exc:  # the cache is an optimization: never fail the caller for it
        log.warning("could not write the sha256 cache %s: %s", target, exc)
