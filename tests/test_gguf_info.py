"""GGUF inspection: metadata of the real model, and a specific ModelLoadError for every kind of bad file.

Bad files are built here: small GGUFs written by the tests' one GGUF writer (tests/gguf_writer.py),
hand-assembled GGUF v3 bytes where the writer cannot produce the fault (non-UTF-8 / duplicate keys), and
prefixes of the real model.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
from pathlib import Path

import gguf
import pytest
from gguf_writer import write_gguf

from app import paths
from app.catalog.gguf import file_sha256, inspect_model
from app.catalog.gguf_header import ArrayInfo, read_gguf_header
from app.errors import ModelLoadError


def _gguf_string(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def raw_gguf(kvs: list[tuple[bytes, bytes]]) -> bytes:
    """GGUF v3 bytes with no tensors; each kv is (raw key bytes, a UINT32 value's payload)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, payload in kvs:
        out += _gguf_string(key) + struct.pack("<i", int(gguf.GGUFValueType.UINT32)) + payload
    return out


def _load_error(path: Path, **kw) -> str:
    with pytest.raises(ModelLoadError) as exc_info:
        inspect_model(path, **kw)
    assert exc_info.value.path is not None and Path(exc_info.value.path).name == Path(path).name
    return str(exc_info.value)


# ----------------------------------------------------------------------------------------- good files


def test_tiny_model_fields(tmp_path: Path) -> None:
    info = inspect_model(write_gguf(tmp_path / "tiny.gguf"))
    assert (info.architecture, info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == ("llama", 2, 64, 4, 2)
    assert info.head_dim_k == info.head_dim_v == 16  # no key_length: n_embd / n_head
    assert info.n_vocab == 100 and info.bos_token_id == 1 and info.eos_token_id == 2
    assert info.parameter_count == 100 * 64 + 2 * 64 * 64 + 64
    assert info.tensor_bytes == 100 * 64 * 4 + 2 * 64 * 64 * 2 + 64 * 4
    assert info.layer_bytes == (64 * 64 * 2, 64 * 64 * 2) and info.output_tied
    assert info.quantization == "F32"  # no general.file_type: the type holding most bytes in 2-D tensors
    assert info.chat_template is None and not info.is_embedding_model and info.swa_layers == ()
    d = info.to_dict()
    assert d["id"] == "tiny" and json.loads(json.dumps(d))["layer_bytes"] == [8192, 8192]


def test_per_layer_kv_heads_and_explicit_head_dims(tmp_path: Path) -> None:
    kv = {"llama.attention.key_length": 32, "llama.attention.value_length": 24,
          "tokenizer.chat_template": "{{ messages }}", "general.file_type": 7}
    info = inspect_model(write_gguf(tmp_path / "m.gguf", kv=kv, head_count_kv=[2, 0]))
    assert info.n_head_kv == (2, 0) and info.kv_heads_per_layer() == (2, 0)
    assert (info.head_dim_k, info.head_dim_v) == (32, 24)
    assert info.chat_template == "{{ messages }}" and info.quantization == "Q8_0"


def test_swa_pattern_from_metadata(tmp_path: Path) -> None:
    kv = {"gemma3.attention.sliding_window": 512, "gemma3.attention.sliding_window_pattern": 2}
    info = inspect_model(write_gguf(tmp_path / "g.gguf", "gemma3", kv=kv, n_layer=4))
    assert info.swa_pattern == 2 and info.swa_layers == (True, False, True, False)
    kv["gemma3.attention.sliding_window_pattern"] = [False, True, True, False]
    info = inspect_model(write_gguf(tmp_path / "g2.gguf", "gemma3", kv=kv, n_layer=4))
    assert info.swa_pattern is None and info.swa_layers == (False, True, True, False)


def test_reader_agrees_with_gguf_reader(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "x.gguf", kv={"general.name": "X", "llama.attention.sliding_window": 64})
    ours = read_gguf_header(path)
    ref = gguf.GGUFReader(str(path))
    assert ours.data_offset == ref.data_offset and ours.alignment == ref.alignment
    assert [(t.name, t.type_name, t.offset, t.n_bytes, t.n_elements) for t in ours.tensors] == \
        [(t.name, t.tensor_type.name, t.data_offset - ref.data_offset, t.n_bytes, t.n_elements) for t in ref.tensors]
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        assert ours.metadata[key] == (tuple(field.contents()) if isinstance(field.contents(), list)
                                      else field.contents()), key
    assert ours.min_file_size == path.stat().st_size


def test_long_arrays_are_not_decoded(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "v.gguf", n_vocab=5000, embedding_length=8,
                      kv={"tokenizer.ggml.scores": [0.0] * 5000})
    meta = read_gguf_header(path).metadata
    assert meta["tokenizer.ggml.tokens"] == ArrayInfo("STRING", 5000)
    assert meta["tokenizer.ggml.scores"] == ArrayInfo("FLOAT32", 5000)


# ------------------------------------------------------------------------------------------ bad files


def test_missing_file(tmp_path: Path) -> None:
    assert "not found" in _load_error(tmp_path / "nope.gguf")


def test_folder(tmp_path: Path) -> None:
    (tmp_path / "dir.gguf").mkdir()
    assert "folder" in _load_error(tmp_path / "dir.gguf")


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "e.gguf").write_bytes(b"")
    assert "empty file" in _load_error(tmp_path / "e.gguf")


def test_random_bytes(tmp_path: Path) -> None:
    data = b"\x00\xff\x13\x37" + random.Random(1).randbytes(4092)
    (tmp_path / "r.gguf").write_bytes(data)
    msg = _load_error(tmp_path / "r.gguf")
    assert "not a GGUF file (magic bytes" in msg and "\\x00\\xff" in msg


def test_text_file_renamed(tmp_path: Path) -> None:
    (tmp_path / "notes.gguf").write_text("hello, this is not a model\nreally\n")
    msg = _load_error(tmp_path / "notes.gguf")
    assert "not a GGUF file (magic bytes b'hell'" in msg and "text file" in msg


def test_git_lfs_pointer(tmp_path: Path) -> None:
    (tmp_path / "lfs.gguf").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 1\n")
    assert "Git LFS pointer" in _load_error(tmp_path / "lfs.gguf")


def test_empty_key(tmp_path: Path) -> None:
    # GGUFWriter accepts an empty key; llama.cpp's gguf.cpp refuses it ("key N is empty").
    path = write_gguf(tmp_path / "k.gguf", kv={"": 3})
    msg = _load_error(path)
    assert "malformed" in msg and "empty" in msg and "key #" in msg


def test_non_utf8_key(tmp_path: Path) -> None:
    (tmp_path / "u.gguf").write_bytes(raw_gguf([(b"general.\xff\xfe", struct.pack("<I", 1))]))
    msg = _load_error(tmp_path / "u.gguf")
    assert "malformed" in msg and "not valid UTF-8" in msg


def test_duplicate_key(tmp_path: Path) -> None:
    kv = (b"general.alignment", struct.pack("<I", 32))
    (tmp_path / "d.gguf").write_bytes(raw_gguf([kv, kv]))
    assert "duplicate metadata key 'general.alignment'" in _load_error(tmp_path / "d.gguf")


def test_bad_value_type(tmp_path: Path) -> None:
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _gguf_string(b"general.x") + struct.pack("<i", 99)
    (tmp_path / "t.gguf").write_bytes(data)
    assert "unknown value type 99" in _load_error(tmp_path / "t.gguf")


def test_unsupported_gguf_version(tmp_path: Path) -> None:
    (tmp_path / "v1.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
    assert "version 1" in _load_error(tmp_path / "v1.gguf")


def test_projector_file(tmp_path: Path) -> None:
    msg = _load_error(write_gguf(tmp_path / "mmproj.gguf", "clip"))
    assert "multimodal projector (mmproj), not a language model" in msg


def test_unknown_architecture(tmp_path: Path) -> None:
    msg = _load_error(write_gguf(tmp_path / "odd.gguf", "notanarch"))
    assert "unsupported architecture 'notanarch'" in msg


def test_lora_adapter(tmp_path: Path) -> None:
    assert "LoRA adapter" in _load_error(write_gguf(tmp_path / "a.gguf", kv={"general.type": "adapter"}))


def test_no_tensors(tmp_path: Path) -> None:
    assert "no tensors" in _load_error(write_gguf(tmp_path / "voc.gguf", tensors=False))


def test_embedding_model_as_chat(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "emb.gguf", "nomic-bert", kv={"nomic-bert.pooling_type": 1})
    assert inspect_model(path).is_embedding_model
    assert "embedding model" in _load_error(path, require_chat=True)


def test_truncated_tensor_data(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "full.gguf")
    size = path.stat().st_size
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: size - 100])
    assert f"truncated: expected at least {size} bytes, file has {size - 100} bytes" in _load_error(cut)


def test_every_prefix_is_a_clean_error(tmp_path: Path) -> None:
    """No prefix of a valid file may raise anything but ModelLoadError (nor crash the process)."""
    data = write_gguf(tmp_path / "full.gguf").read_bytes()
    header_end = read_gguf_header(tmp_path / "full.gguf").data_offset
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data)
    for n in [len(data) - 1, len(data) // 2, *range(header_end + 8, -1, -1)]:  # shrinking: cheap truncate
        os.truncate(cut, n)
        msg = _load_error(cut)
        assert any(w in msg for w in ("truncated", "empty file", "not a GGUF")), (n, msg)


def test_random_corruption_never_escapes(tmp_path: Path) -> None:
    data = bytearray(write_gguf(tmp_path / "full.gguf").read_bytes())
    header_end = read_gguf_header(tmp_path / "full.gguf").data_offset
    rng = random.Random(7)
    bad = tmp_path / "bad.gguf"
    refused = read = 0
    for _ in range(300):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(4, header_end)] = rng.randrange(256)
        bad.write_bytes(mutated)
        try:
            info = inspect_model(bad)
        except ModelLoadError as exc:  # anything else escaping fails the test
            assert str(exc) and exc.path == str(bad), exc
            refused += 1
        else:
            assert info.path == str(bad)
            read += 1
    assert refused + read == 300 and refused > 0  # most mutations break the header, and each is refused cleanly


# ------------------------------------------------------------------------------------------- sha256


def test_file_sha256_cached(tmp_path: Path) -> None:
    f = tmp_path / "w.bin"
    f.write_bytes(b"abc" * 1000)
    digest = hashlib.sha256(b"abc" * 1000).hexdigest()
    assert file_sha256(f) == digest
    cache_file = paths.home() / "cache" / "sha256.json"
    cache = json.loads(cache_file.read_text())
    entry = cache[str(f.resolve())]
    assert entry["size"] == 3000 and entry["sha256"] == digest
    entry["sha256"] = "cached-value"  # a hit must not re-hash
    cache_file.write_text(json.dumps(cache))
    assert file_sha256(f) == "cached-value"
    f.write_bytes(b"abcd" * 1000)  # size/mtime change: recomputed
    assert file_sha256(f) == hashlib.sha256(b"abcd" * 1000).hexdigest()
    assert not [p for p in cache_file.parent.iterdir() if p.name.startswith(".sha256-")]


def test_file_sha256_corrupt_cache(tmp_path: Path) -> None:
    cache_file = paths.home() / "cache" / "sha256.json"
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_text("{not json")
    f = tmp_path / "w.bin"
    f.write_bytes(b"x")
    assert file_sha256(f) == hashlib.sha256(b"x").hexdigest()


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a": "\\ud800"}', '"just a string"'])
def test_file_sha256_damaged_cache_never_stops_the_command(tmp_path: Path, text: str) -> None:
    """A cache nested 100,000 deep was a RecursionError (not a ValueError) out of every command that hashed."""
    cache_file = paths.home() / "cache" / "sha256.json"
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    cache_file.write_text(text)
    f = tmp_path / "w.bin"
    f.write_bytes(b"y")
    assert file_sha256(f) == hashlib.sha256(b"y").hexdigest()
    assert json.loads(cache_file.read_text())[str(f.resolve())]["size"] == 1  # rewritten as a good cache


# ------------------------------------------------------------------------------------ the real model


@pytest.mark.model
def test_bundled_model_metadata(bundled_model: Path) -> None:
    info = inspect_model(bundled_model, require_chat=True)
    assert info.architecture == "gemma3" and info.quantization == "Q4_K_M" and info.file_type == 15
    assert (info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == (18, 640, 4, 1)
    assert (info.head_dim_k, info.head_dim_v, info.n_ff) == (256, 256, 2048)
    assert info.context_length == 32768 and info.sliding_window == 512 and info.swa_pattern == 6
    # llama.cpp's own load log: "layer 5 ... is_swa = 0" for layers 5, 11, 17; 1 elsewhere.
    assert [il for il, swa in enumerate(info.swa_layers) if not swa] == [5, 11, 17]
    assert info.n_vocab == 262144 and (info.bos_token_id, info.eos_token_id) == (2, 1)
    assert info.chat_template is None and not info.is_embedding_model
    assert info.parameter_count == 268_098_176 and info.tensor_count == 236
    assert info.tensor_bytes == 246_587_904  # llama.cpp: "CPU_Mapped model buffer size = 235.16 MiB"
    assert info.size_bytes == bundled_model.stat().st_size and info.id == "gemma-3-270m-q4_k_m"


def _prefix_copy(src: Path, dst: Path, n: int) -> Path:
    with open(src, "rb") as f:
        dst.write_bytes(f.read(n))
    return dst


@pytest.mark.model
def test_bundled_model_truncated_to_half(bundled_model: Path, tmp_path: Path) -> None:
    size = bundled_model.stat().st_size
    cut = _prefix_copy(bundled_model, tmp_path / "half.gguf", size // 2)
    assert f"truncated: expected at least {size} bytes, file has {size // 2} bytes" in _load_error(cut)


@pytest.mark.model
def test_bundled_model_truncated_in_header(bundled_model: Path, tmp_path: Path) -> None:
    for n in (100, 3_000_000):  # inside the metadata; inside the vocabulary array
        msg = _load_error(_prefix_copy(bundled_model, tmp_path / f"h{n}.gguf", n))
        assert "truncated" in msg and "header" in msg and f"file has {n} bytes" in msg


@pytest.mark.model
def test_bundled_model_sha256_matches_package(bundled_model: Path) -> None:
    expected = hashlib.sha256(bundled_model.read_bytes()).hexdigest()
    assert inspect_model(bundled_model, with_sha256=True).sha256 == expected
    assert os.path.exists(paths.home() / "cache" / "sha256.json")
