"""Inspect a GGUF model file before llama.cpp ever sees it.

llama.cpp aborts or fails with one generic line ("failed to load model") on many bad files; Hearth reads and
validates the header itself first and raises ``ModelLoadError`` (with ``path``) naming the exact problem:
missing file, not a GGUF (wrong magic), truncated (inside the header, or tensor data shorter than the header
promises), malformed metadata (empty / non-UTF-8 / duplicate key, bad value type), malformed tensor info,
unsupported architecture, a multimodal projector (mmproj / ``clip``) or LoRA adapter offered as a model, and
(with ``require_chat=True``) an embedding-only model offered as a chat model.

Design decision: the header is parsed by a small reader in this module (``read_gguf_header``), following the
GGUF v3 spec (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) and the checks of llama.cpp's own
parser (``ggml/src/gguf.cpp``: empty/duplicate keys, nested arrays, n_dims <= 4, tensor name < 64 bytes,
row size divisible by the block size, tensor data stored in order at aligned offsets). ``gguf.GGUFReader``
(gguf 0.19) was the first choice, but it builds one numpy array per vocabulary string: 8.5 s on the bundled
Gemma 3 270M (262,144 tokens) on the 2-core test machine, and on a damaged file it fails with numpy reshape
errors that say nothing useful. This reader skips large arrays (keeping their length), reads with plain
file reads (no memory map, so a file shrinking underneath cannot SIGBUS the process) and never trusts a count
or length without checking it against the file size. The ``gguf`` package still supplies every constant:
value types, tensor types and block sizes (``GGML_QUANT_SIZES``), file types, key names and architectures.
``tests/test_gguf_info.py`` checks this reader against ``GGUFReader`` on files written by ``GGUFWriter``.

Units: sizes and offsets in bytes; context lengths in tokens.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

import gguf

from app import paths
from app.errors import ModelLoadError
from app.fileio import atomic_write_text

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

# Tensor types newer than gguf 0.19 that the vendored ggml knows: type id -> (name, block size, bytes/block).
_EXTRA_TENSOR_TYPES = {42: ("Q2_0", 64, 18)}
_MAX_DECODED_ARRAY = 4096     # longer arrays are kept as ArrayInfo (length + type), not decoded
_MAX_STRING = 1 << 30         # llama.cpp GGUF_MAX_STRING_LENGTH / GGUF_MAX_ARRAY_ELEMENTS
_MAX_DIMS = 4                 # GGML_MAX_DIMS
_MAX_TENSOR_NAME = 64         # GGML_MAX_NAME (names must be shorter)
_DEFAULT_ALIGNMENT = 32       # GGUF_DEFAULT_ALIGNMENT
_GUESSED_FILE_TYPE = 1024     # LLAMA_FTYPE_GUESSED flag

_VT = gguf.GGUFValueType
_SCALAR_FORMATS = {
    _VT.UINT8: "B", _VT.INT8: "b", _VT.UINT16: "H", _VT.INT16: "h", _VT.UINT32: "I", _VT.INT32: "i",
    _VT.FLOAT32: "f", _VT.BOOL: "?", _VT.UINT64: "Q", _VT.INT64: "q", _VT.FLOAT64: "d",
}


# --------------------------------------------------------------------------------------------- header


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array too long to decode (e.g. the vocabulary): element type and length only."""

    type: str
    count: int


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry. ``offset``: bytes from the start of the data section; ``n_bytes``: its data
    size in bytes; ``shape``: ggml order (ne0 first)."""

    name: str
    shape: tuple[int, ...]
    type_name: str
    offset: int
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """What the header of a GGUF file says. ``metadata``: key -> value (long arrays as ``ArrayInfo``);
    ``value_types``: key -> GGUF value type name; ``data_offset``: file offset of tensor data (bytes);
    ``min_file_size``: bytes the file must have to hold every tensor."""

    version: int
    metadata: dict[str, Any]
    value_types: dict[str, str]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int
    min_file_size: int


class _Truncated(Exception):
    def __init__(self, what: str, pos: int) -> None:
        super().__init__(what)
        self.what, self.pos = what, pos


class _Malformed(Exception):
    pass


class _Cursor:
    """Sequential little-endian reads over a file through a sliding in-memory window (``buf`` holds the bytes
    from file offset ``base``). Every length is checked against the file size before anything is read or
    allocated; ``skip`` passes over large arrays without reading them."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.size, self.pos, self.base, self.buf = f, size, 0, 0, bytearray()

    def need(self, n: int, what: str) -> int:
        """Make ``n`` bytes from ``pos`` available; return their index in ``buf``."""
        end = self.pos + n
        if end > self.size:
            raise _Truncated(what, self.pos)
        if end > self.base + len(self.buf):
            del self.buf[:self.pos - self.base]
            self.base = self.pos
            self.f.seek(self.base + len(self.buf))
            self.buf += self.f.read(max(end - self.base - len(self.buf), 1 << 20))
            if end > self.base + len(self.buf):  # the file shrank while we read it
                raise _Truncated(what, self.pos)
        return self.pos - self.base

    def skip(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            raise _Truncated(what, self.pos)
        self.pos += n

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize("<" + fmt)
        vals = struct.unpack_from("<" + fmt, self.buf, self.need(n, what))
        self.pos += n
        return vals[0] if len(vals) == 1 else vals

    def raw(self, n: int, what: str) -> bytes:
        i = self.need(n, what)
        self.pos += n
        return bytes(self.buf[i:i + n])

    def string_bytes(self, what: str) -> bytes:
        n = self.unpack("Q", what)
        if n > _MAX_STRING:
            raise _Malformed(f"{what} has an impossible length of {n} bytes")
        return self.raw(n, what)


def read_gguf_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Read and validate the header of the GGUF file at ``path``. Raises ``ModelLoadError`` naming the
    problem (see the module docstring); never lets a low-level error escape."""
    p = Path(path)
    size = _check_file(p)
    try:
        with open(p, "rb") as f:
            return _parse(_Cursor(f, size), p)
    except ModelLoadError:
        raise
    except _Truncated as exc:
        raise ModelLoadError(
            f"{p.name}: truncated: the file ends inside the GGUF header (while reading {exc.what} at byte "
            f"{exc.pos}); file has {size} bytes. Download it again.", path=str(p)) from None
    except _Malformed as exc:
        raise ModelLoadError(f"{p.name}: malformed GGUF: {exc}", path=str(p)) from None
    except OSError as exc:
        raise ModelLoadError(f"{p.name}: cannot read the file: {exc}", path=str(p)) from exc
    except Exception as exc:  # a bug in this reader must still not take the process down
        log.exception("unexpected error reading %s", p)
        raise ModelLoadError(f"{p.name}: malformed GGUF ({type(exc).__name__}: {exc})", path=str(p)) from exc


def _check_file(p: Path) -> int:
    if not p.exists():
        raise ModelLoadError(f"model file not found: {p}", path=str(p))
    if p.is_dir():
        raise ModelLoadError(f"{p} is a folder, not a GGUF model file", path=str(p))
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(64)
    except OSError as exc:
        raise ModelLoadError(f"{p.name}: cannot read the file: {exc}", path=str(p)) from exc
    if size == 0:
        raise ModelLoadError(f"{p.name}: empty file (0 bytes), not a GGUF file", path=str(p))
    if head[:4] != b"GGUF":
        raise ModelLoadError(f"{p.name}: not a GGUF file (magic bytes {head[:4]!r}, expected b'GGUF')"
                             + _content_hint(head), path=str(p))
    return size


def _content_hint(head: bytes) -> str:
    """A guess at what a non-GGUF file is, from its first bytes."""
    if head.startswith(b"version https://git-lfs"):
        return "; it is a Git LFS pointer, not the model data (fetch it with `git lfs pull`)"
    low = head.lstrip().lower()
    if low.startswith((b"<!doctype html", b"<html")):
        return "; it is an HTML page (a failed download?)"
    if head.startswith((b"PK\x03\x04", b"\x80\x02", b"\x80\x04")):
        return "; it looks like a PyTorch/zip checkpoint: convert it with llama.cpp's convert_hf_to_gguf.py"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    return "; it looks like a text file" if text.isprintable() or "\n" in text else ""


def _parse(c: _Cursor, p: Path) -> GGUFHeader:
    c.unpack("I", "the magic")
    version = _read_version(c, p)
    n_tensors = c.unpack("q", "the tensor count")
    n_kv = c.unpack("q", "the metadata count")
    if n_tensors < 0 or n_kv < 0:
        raise _Malformed(f"negative counts in the header (tensors {n_tensors}, metadata keys {n_kv})")
    metadata, types = _read_metadata(c, n_kv)
    alignment = _alignment(metadata, types)
    tensors = _read_tensor_infos(c, n_tensors)
    data_offset = -(-c.pos // alignment) * alignment
    _check_tensor_layout(tensors, alignment)
    end = max((t.offset + t.n_bytes for t in tensors), default=0)
    header = GGUFHeader(version, metadata, types, tuple(tensors), alignment, data_offset, data_offset + end)
    if c.size < header.min_file_size:
        raise ModelLoadError(
            f"{p.name}: truncated: expected at least {header.min_file_size} bytes, file has {c.size} bytes "
            "(an interrupted download?)", path=str(p))
    return header


def _read_version(c: _Cursor, p: Path) -> int:
    version = c.unpack("I", "the version")
    if version != 0 and version & 0xFFFF == 0:
        raise ModelLoadError(f"{p.name}: big-endian GGUF (version field {version:#x}); this machine needs a "
                             "little-endian file", path=str(p))
    if version == 1:
        raise ModelLoadError(f"{p.name}: GGUF version 1 is no longer supported by llama.cpp; convert the "
                             "model again", path=str(p))
    if version not in (2, 3):
        raise ModelLoadError(f"{p.name}: unsupported GGUF version {version} (llama.cpp reads 2 and 3)",
                             path=str(p))
    return version


def _read_metadata(c: _Cursor, n_kv: int) -> tuple[dict[str, Any], dict[str, str]]:
    metadata: dict[str, Any] = {}
    types: dict[str, str] = {}
    for i in range(n_kv):
        key = _read_key(c, i)
        if key in metadata:
            raise _Malformed(f"duplicate metadata key {key!r} (key #{i})")
        vtype = _value_type(c.unpack("i", f"the type of metadata key {key!r}"), key)
        if vtype == _VT.ARRAY:
            etype = _value_type(c.unpack("i", f"the element type of {key!r}"), key)
            if etype == _VT.ARRAY:
                raise _Malformed(f"metadata key {key!r} is an array of arrays, which llama.cpp does not read")
            metadata[key] = _read_array(c, key, etype)
            types[key] = f"ARRAY[{etype.name}]"
        else:
            metadata[key] = _read_value(c, key, vtype)
            types[key] = vtype.name
    return metadata, types


def _read_key(c: _Cursor, i: int) -> str:
    raw = c.string_bytes(f"metadata key #{i}")
    if not raw:
        raise _Malformed(f"metadata key #{i} is an empty string")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _Malformed(f"metadata key #{i} is not valid UTF-8 ({raw[:40]!r})") from None


def _value_type(code: int, key: str) -> gguf.GGUFValueType:
    try:
        return _VT(code)
    except ValueError:
        raise _Malformed(f"metadata key {key!r} has an unknown value type {code}") from None


def _read_value(c: _Cursor, key: str, vtype: gguf.GGUFValueType) -> Any:
    if vtype == _VT.STRING:
        return c.string_bytes(f"the value of {key!r}").decode("utf-8", errors="replace")
    return c.unpack(_SCALAR_FORMATS[vtype], f"the value of {key!r}")


def _read_array(c: _Cursor, key: str, etype: gguf.GGUFValueType) -> Any:
    count = c.unpack("Q", f"the length of {key!r}")
    if count > _MAX_STRING:
        raise _Malformed(f"metadata array {key!r} has an impossible length of {count}")
    if etype == _VT.STRING:
        return _read_string_array(c, key, count)
    fmt = _SCALAR_FORMATS[etype]
    n_bytes = count * struct.calcsize(fmt)
    if count > _MAX_DECODED_ARRAY:
        c.skip(n_bytes, f"the values of {key!r}")
        return ArrayInfo(etype.name, count)
    values = struct.unpack_from(f"<{count}{fmt}", c.buf, c.need(n_bytes, f"the values of {key!r}"))
    c.pos += n_bytes
    return tuple(values)


def _read_string_array(c: _Cursor, key: str, count: int) -> Any:
    decode = count <= _MAX_DECODED_ARRAY
    out = []
    what = f"the values of {key!r}"
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", c.buf, c.need(8, what))
        if n > _MAX_STRING:
            raise _Malformed(f"a string in {key!r} has an impossible length of {n} bytes")
        c.pos += 8
        if decode:
            out.append(c.raw(n, what).decode("utf-8", errors="replace"))
        else:
            c.skip(n, what)
    return tuple(out) if decode else ArrayInfo("STRING", count)


def _alignment(metadata: dict[str, Any], types: dict[str, str]) -> int:
    key = gguf.Keys.General.ALIGNMENT
    if key not in metadata:
        return _DEFAULT_ALIGNMENT
    if types[key] != "UINT32":
        raise _Malformed(f"{key} must be UINT32, got {types[key]}")
    value = metadata[key]
    if value == 0 or value & (value - 1):
        raise _Malformed(f"{key} is {value}, not a power of two")
    return value


def _tensor_type(code: int, name: str) -> tuple[str, int, int]:
    if code in _EXTRA_TENSOR_TYPES:
        return _EXTRA_TENSOR_TYPES[code]
    try:
        qtype = gguf.GGMLQuantizationType(code)
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise _Malformed(f"tensor {name!r} has an unknown tensor type {code}") from None
    return qtype.name, block, type_size


def _read_tensor_infos(c: _Cursor, n_tensors: int) -> list[TensorInfo]:
    tensors: list[TensorInfo] = []
    names: set[str] = set()
    for i in range(n_tensors):
        raw = c.string_bytes(f"the name of tensor #{i}")
        name = raw.decode("utf-8", errors="replace")
        if len(raw) >= _MAX_TENSOR_NAME:
            raise _Malformed(f"tensor #{i} name is {len(raw)} bytes long (llama.cpp allows < 64)")
        if name in names:
            raise _Malformed(f"duplicate tensor name {name!r}")
        names.add(name)
        tensors.append(_read_tensor_info(c, name))
    return tensors


def _read_tensor_info(c: _Cursor, name: str) -> TensorInfo:
    n_dims = c.unpack("I", f"tensor {name!r}")
    if n_dims > _MAX_DIMS:
        raise _Malformed(f"tensor {name!r} has {n_dims} dimensions (at most {_MAX_DIMS})")
    shape = tuple(c.unpack("q", f"tensor {name!r}") for _ in range(n_dims))
    if any(d < 0 for d in shape):
        raise _Malformed(f"tensor {name!r} has a negative dimension {shape}")
    type_name, block, type_size = _tensor_type(c.unpack("i", f"tensor {name!r}"), name)
    offset = c.unpack("Q", f"tensor {name!r}")
    if shape and shape[0] % block:
        raise _Malformed(f"tensor {name!r} of type {type_name} has {shape[0]} elements per row, not a "
                         f"multiple of its block size {block}")
    n_elements = 1
    for d in shape:
        n_elements *= d
    return TensorInfo(name, shape, type_name, offset, n_elements, n_elements // block * type_size)


def _check_tensor_layout(tensors: list[TensorInfo], alignment: int) -> None:
    """llama.cpp (gguf.cpp) requires each tensor at exactly the running, alignment-padded end of the
    previous one."""
    expected = 0
    for t in tensors:
        if t.offset != expected:
            raise _Malformed(f"tensor {t.name!r} has data offset {t.offset}, expected {expected}")
        expected += -(-t.n_bytes // alignment) * alignment


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
    try:
        data = json.loads(_sha256_cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_cache(cache: dict[str, Any]) -> None:
    target = _sha256_cache_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, json.dumps(cache, indent=1, sort_keys=True), prefix=".sha256-")
    except OSError as exc:  # the cache is an optimization: never fail the caller for it
        log.warning("could not write the sha256 cache %s: %s", target, exc)
