"""A small GGUF header reader (``read_gguf_header``): the GGUF v3 spec and llama.cpp's own checks, plain file
reads (no memory map), every count and length checked against the file size; constants from the ``gguf``
package. Why not ``gguf.GGUFReader``: docs/engine.md "The GGUF header reader". Sizes and offsets in bytes."""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import gguf

from app.errors import ModelLoadError

log = logging.getLogger(__name__)

# Tensor types newer than gguf 0.19 that the vendored ggml knows: type id -> (name, block size, bytes/block).
_EXTRA_TENSOR_TYPES = {42: ("Q2_0", 64, 18)}
_MAX_DECODED_ARRAY = 4096     # longer arrays are kept as ArrayInfo (length + type), not decoded
_MAX_STRING = 1 << 30         # llama.cpp GGUF_MAX_STRING_LENGTH / GGUF_MAX_ARRAY_ELEMENTS
_MAX_DIMS = 4                 # GGML_MAX_DIMS
_MAX_TENSOR_NAME = 64         # GGML_MAX_NAME (names must be shorter)
_DEFAULT_ALIGNMENT = 32       # GGUF_DEFAULT_ALIGNMENT

_VT = gguf.GGUFValueType
_SCALAR_FORMATS = {
    _VT.UINT8: "B", _VT.INT8: "b", _VT.UINT16: "H", _VT.INT16: "h", _VT.UINT32: "I", _VT.INT32: "i",
    _VT.FLOAT32: "f", _VT.BOOL: "?", _VT.UINT64: "Q", _VT.INT64: "q", _VT.FLOAT64: "d",
}



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
