"""``/v1/embeddings``: request checks and the answer body.

The embedder is an ``app.retrieval.embedder.Embedder`` (its own engine process, apart from the chat engine's
queue) or anything with its interface: ``model_id``, ``embed(texts) -> vectors`` and ``count_tokens(texts)``
(for ``usage``); ``detokenize(seqs)`` when it takes token-id input (ids of the embedding model's own
vocabulary, read back to text and embedded as such: docs/server.md). A ``dimensions`` other than the model's
is refused.
"""

from __future__ import annotations

import base64
from typing import Any, Union

import numpy as np

from app.errors import InvalidRequest
from app.server.openai_schema import EmbeddingRequest

MAX_INPUTS = 2048

Inputs = Union[list[str], list[list[int]]]  # texts, or one list of token ids per input


def inputs(body: EmbeddingRequest) -> Inputs:
    """``input`` as a list of texts or a list of token-id lists (a string, a list of strings, a list of ints:
    one input, or a list of lists of ints). Raises ``InvalidRequest`` (param ``input``) naming the item."""
    raw = body.input
    items: list[Any] = [raw] if isinstance(raw, str) or (raw and all(_is_id(t) for t in raw)) else list(raw)
    if not items:
        raise InvalidRequest("input must not be empty", param="input")
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(f"at most {MAX_INPUTS} inputs per request, got {len(items)}", param="input")
    if all(isinstance(t, str) for t in items):
        for i, t in enumerate(items):
            if not t:
                raise InvalidRequest(f"input[{i}] is an empty string", param="input")
        return items
    for i, ids in enumerate(items):
        if not isinstance(ids, list) or not all(_is_id(t) for t in ids):
            raise InvalidRequest(f"input[{i}]: input must be a string, a list of strings, a list of token ids "
                                 "(integers) or a list of lists of token ids, not a mix", param="input")
        if not ids:
            raise InvalidRequest(f"input[{i}] is an empty list of token ids", param="input")
    return items


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def run(embedder: Any, given: Inputs) -> tuple[np.ndarray, int]:
    """Blocking: vectors (float32, one row per input) and the prompt token count (token-id inputs: the ids
    given). Raises ``InvalidRequest`` for token ids the embedder has no vocabulary for, or outside it."""
    if given and isinstance(given[0], list):
        if not callable(getattr(embedder, "detokenize", None)):
            raise InvalidRequest("this embedding model does not take token-id input; send text", param="input")
        texts = embedder.detokenize(given)
        tokens = sum(len(ids) for ids in given)
    else:
        texts = list(given)
        tokens = None
    vectors = np.asarray(embedder.embed(texts), dtype=np.float32)
    return vectors, int(sum(embedder.count_tokens(texts))) if tokens is None else tokens


def response(body: EmbeddingRequest, model: str, vectors: np.ndarray, tokens: int) -> dict[str, Any]:
    """The OpenAI ``list`` of ``embedding`` objects (floats, or base64 of little-endian float32) with
    ``usage``. Raises ``InvalidRequest`` for a ``dimensions`` other than the model's."""
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
