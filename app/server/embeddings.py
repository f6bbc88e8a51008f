"""``/v1/embeddings``: request checks and the answer body.

The embedder is an ``app.retrieval.embedder.Embedder`` (its own engine process, apart from the chat engine's
queue) or anything with its interface: ``model_id``, ``embed(texts) -> vectors`` and ``count_tokens(texts)``
(for ``usage``). Token-id inputs and a ``dimensions`` other than the model's are refused.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from app.errors import InvalidRequest
from app.server.openai_schema import EmbeddingRequest

MAX_INPUTS = 2048


def inputs(body: EmbeddingRequest) -> list[str]:
    raw = body.input
    texts = [raw] if isinstance(raw, str) else list(raw)
    if not texts:
        raise InvalidRequest("input must not be empty", param="input")
    if not all(isinstance(t, str) for t in texts):
        raise InvalidRequest("token-id input is not supported; send text", param="input")
    if len(texts) > MAX_INPUTS:
        raise InvalidRequest(f"at most {MAX_INPUTS} inputs per request, got {len(texts)}", param="input")
    for i, t in enumerate(texts):
        if not t:
            raise InvalidRequest(f"input[{i}] is an empty string", param="input")
    return texts


def run(embedder: Any, texts: list[str]) -> tuple[np.ndarray, int]:
    """Blocking: vectors (float32, one row per text) and the prompt token count."""
    vectors = np.asarray(embedder.embed(texts), dtype=np.float32)
    return vectors, int(sum(embedder.count_tokens(texts)))


def response(body: EmbeddingRequest, model: str, vectors: np.ndarray, tokens: int) -> dict[str, Any]:
    if body.dimensions is not None and body.dimensions != vectors.shape[1]:
        raise InvalidRequest(f"this model's embeddings have {vectors.shape[1]} dimensions; dimensions="
                             f"{body.dimensions} is not supported", param="dimensions")
    data = []
    for i, v in enumerate(vectors):
        emb: Any = (base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
                    if body.encoding_format == "base64" else [float(x) for x in v])
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
