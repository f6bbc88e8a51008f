"""Keys of the prefix cache: a chain of hashes, one per chunk of a prompt's canonical layout, each naming the
exact tokens and the cuts up to that chunk's end (as vLLM's ``kv_cache_utils.hash_block_tokens`` chains its
blocks), and the engine fingerprint every key starts from (docs/prefix-cache.md)."""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Sequence

FORMAT_VERSION = 2  # of the segment file (``entry``), part of the fingerprint; 1 = one file per prompt
# The prefill layout a segment's KV was laid out in (app.engine.local.layout), part of the fingerprint: 1 = chunks
# of n_batch from position 0; 2 = also cut before each turn break; 3 = the break after an answer too (the
# transcript's ``User``); 4 = a tail shorter than ``layout.TAIL_SPLIT`` goes in with the last token.
LAYOUT_VERSION = 4


def _tok_bytes(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


def segment_keys(fp: str, tokens: Sequence[int], cuts: Sequence[int]) -> list[str]:
    """One key per chunk of ``tokens``' layout: ``cuts`` are where the chunks end (sorted, each ≤ len(tokens));
    key i (hex sha256) covers the fingerprint ``fp``, every token before ``cuts[i]`` and every cut up to it:
    ``k[i] = sha256(k[i-1] | start | end | tokens[start:end])``, ``k[-1] = sha256(fp)``. Two prompts get the same
    key i exactly when their first ``cuts[i]`` tokens and their cuts up to there are the same, i.e. when the
    KV of that chunk is the same bits (docs/prefix-cache.md). Shape: ``len(cuts)`` keys. Raises ``ValueError``
    for unsorted cuts or a cut past the tokens."""
    h = hashlib.sha256(fp.encode("ascii")).digest()
    out, start = [], 0
    for end in cuts:
        if not start < end <= len(tokens):
            raise ValueError(f"cut {end} after {start} is not inside the {len(tokens)} tokens")
        h = hashlib.sha256(h + struct.pack("<II", start, end) + _tok_bytes(tokens[start:end])).digest()
        out.append(h.hex())
        start = end
    return out


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
