"""The one GGUF writer of the tests: small, well-formed model files built with ``gguf.GGUFWriter``.

Used by the GGUF inspection tests (tests/test_gguf_info.py) and the ``hearth inspect`` / ``hearth models``
tests (tests/test_cli_inspect.py). The defaults make a 2-layer llama-like model with 64-dim embeddings, 4
attention heads (2 KV heads, so head_dim 16) and a 100-token vocabulary; every size is a parameter. Nothing
here can be loaded by llama.cpp for generation (the tensors are zeros and most are missing): it is metadata for
the inspector and the memory estimate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

__all__ = ["write_gguf"]


def _add_kv(w: gguf.GGUFWriter, kv: dict[str, Any]) -> None:
    """Extra metadata by Python type: bool, int (written as uint32), str, else an array."""
    for key, value in kv.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)


def write_gguf(path: Path, arch: str = "llama", *, kv: dict[str, Any] | None = None, n_layer: int = 2,
               context_length: int = 256, embedding_length: int = 64, feed_forward_length: int = 128,
               head_count: int = 4, head_count_kv: int | list[int] = 2, n_vocab: int = 100,
               template: str | None = None, tensors: bool = True) -> Path:
    """Write a tiny GGUF to ``path`` and return ``path``.

    ``kv``: extra metadata (see ``_add_kv``); ``head_count_kv`` may be a per-layer list; ``template``: a
    ``tokenizer.chat_template``; ``tensors=False`` writes metadata only (a vocabulary-only file). Tensors: the
    token embedding (f32, n_vocab × embedding_length), one f16 ``attn_q`` per layer and an f32 output norm.
    Raises whatever ``gguf.GGUFWriter`` raises for values it cannot write."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layer)
    w.add_context_length(context_length)
    w.add_embedding_length(embedding_length)
    w.add_feed_forward_length(feed_forward_length)
    w.add_head_count(head_count)
    w.add_head_count_kv(head_count_kv)
    w.add_token_list([f"t{i}" for i in range(n_vocab)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if template is not None:
        w.add_chat_template(template)
    _add_kv(w, kv or {})
    if tensors:
        w.add_tensor("token_embd.weight", np.zeros((n_vocab, embedding_length), dtype=np.float32))
        for il in range(n_layer):
            w.add_tensor(f"blk.{il}.attn_q.weight", np.ones((embedding_length, embedding_length), dtype=np.float16))
        w.add_tensor("output_norm.weight", np.ones(embedding_length, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
