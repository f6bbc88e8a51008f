"""Keys of the prefix cache: chained block hashes naming one exact token prefix (as vLLM
``kv_cache_utils.hash_block_tokens``), and the engine fingerprint an entry must match (docs/prefix-cache.md)."""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Sequence

FORMAT_VERSION = 1  # of the entry file (``entry``), part of the fingerprint
# The prefill layout an entry's KV was laid out in (app.engine.local.layout), part of the fingerprint: 1 = chunks of
# n_batch from position 0; 2 = also cut before each turn break; 3 = the break after an answer too (the
# transcript's ``User``). An entry of another layout is never restored.
LAYOUT_VERSION = 3
BLOCK = 64  # tokens per hash block


def _tok_bytes(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


def block_hashes(tokens: Sequence[int], block: int = BLOCK) -> list[str]:
    """Chained hashes of the full blocks of ``tokens``: ``h[i] = sha256(h[i-1] | tokens of block i)``.
    Returns one hex digest per full block (shape: ``len(tokens) // block``); the chain ``PrefixHasher`` keys on."""
    h = PrefixHasher(tokens, block)
    return [h._chain_to(k).hex() for k in range(1, len(tokens) // block + 1)]


class PrefixHasher:
    """``prefix_hash(n)``: the hash naming exactly ``tokens[:n]`` (full-block chain + partial tail + n)."""

    def __init__(self, tokens: Sequence[int], block: int = BLOCK) -> None:
        self.tokens = list(tokens)
        self.block = block
        self._chain = [b""]  # chain[i] = hash after i full blocks

    def _chain_to(self, k: int) -> bytes:
        while len(self._chain) <= k:
            i = len(self._chain) - 1
            blk = self.tokens[i * self.block:(i + 1) * self.block]
            self._chain.append(hashlib.sha256(self._chain[-1] + _tok_bytes(blk)).digest())
        return self._chain[k]

    def prefix_hash(self, n: int) -> str:
        if n > len(self.tokens):
            raise ValueError("prefix longer than tokens")
        full = n // self.block
        parent = self._chain_to(full)
        tail = self.tokens[full * self.block:n]
        return hashlib.sha256(parent + _tok_bytes(tail) + struct.pack("<I", n)).hexdigest()


def fingerprint(model_sha256: str, settings: Any, extra: dict | None = None) -> tuple[str, dict]:
    """The engine fingerprint (hex sha256) and the dict it hashes. ``settings``: ``LoadSettings``."""
    try:
        import llama_cpp

        lib = llama_cpp.__version__
        sysinfo = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - pure tests run without the library
        lib, sysinfo = "unknown", ""
    d = {"format": FORMAT_VERSION, "layout": LAYOUT_VERSION, "llama_cpp_python": lib, "llama_cpp_system": sysinfo,
         "model_sha256": model_sha256, "type_k": settings.type_k, "type_v": settings.type_v,
         "flash_attn": bool(settings.flash_attn), "swa_full": bool(settings.swa_full), "n_ctx": settings.n_ctx,
         "n_batch": settings.n_batch, "n_ubatch": settings.n_ubatch, "n_gpu_layers": settings.n_gpu_layers,
         "offload_kqv": bool(settings.offload_kqv), **(extra or {})}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest(), d
