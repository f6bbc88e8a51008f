"""Token id → the bytes of its text, for ``logprobs`` answers; the token count of a text, for ``hearth``'s
context breakdown.

The engine reports logprobs as token ids. ``Engine.detokenize`` cannot turn them into text while a stream
runs: it is a request in the same FIFO queue, so it would wait for the very generation asking for it. So
the server reads the vocabulary itself, once per model file: llama.cpp loads it with ``vocab_only`` (no
weights, no compute; about a second for a 262k vocabulary) and ``llama_token_to_piece`` gives each
token's exact bytes, whatever the tokenizer type. The file has already been validated and loaded by the
engine process, so this load is not a crash risk for this process.

The same in-process vocabulary counts the tokens of the evidence block a request was given
(``hearth.context.evidence``): ``Engine.count_tokens`` would wait in the queue too.

An engine object may provide ``token_piece_bytes(token_id) -> bytes`` and ``local_token_count(text) -> int``
itself (the fake engine does); they are preferred when present. (Suggested engine change: carry piece bytes
in ``Delta.logprobs``.)
"""

from __future__ import annotations

import ctypes
import threading
from functools import lru_cache
from typing import Any, Callable

from app.errors import ModelLoadError

PieceFn = Callable[[int], bytes]


def piece_fn(engine: Any) -> PieceFn:
    """A function giving the bytes of a token of ``engine``'s model."""
    own = getattr(engine, "token_piece_bytes", None)
    if callable(own):
        return own
    return _LlamaVocab.for_path(str(engine.model_path)).piece


def count_fn(engine: Any) -> Callable[[str], int]:
    """A function giving the number of tokens of a text (no BOS, special tokens as plain text) under
    ``engine``'s vocabulary, without a turn in the engine's queue."""
    own = getattr(engine, "local_token_count", None)
    if callable(own):
        return own
    return _LlamaVocab.for_path(str(engine.model_path)).count


def token_text(b: bytes) -> str:
    """OpenAI's convention: the token's text, or ``bytes:\\xe2\\x80`` for a partial UTF-8 sequence."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{x:02x}" for x in b)


class _LlamaVocab:
    def __init__(self, path: str) -> None:
        import logging

        import llama_cpp
        from llama_cpp import _logger

        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        level = _logger.logger.level
        _logger.logger.setLevel(logging.CRITICAL)  # keep llama.cpp's load log off this process's stderr
        try:
            self._model = llama_cpp.llama_model_load_from_file(path.encode("utf-8"), params)
        finally:
            _logger.logger.setLevel(level)
        if not self._model:
            raise ModelLoadError("llama.cpp could not read the model's vocabulary", path=path)
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self._llama = llama_cpp
        self._lock = threading.Lock()
        self._cache: dict[int, bytes] = {}

    @staticmethod
    @lru_cache(maxsize=2)
    def for_path(path: str) -> "_LlamaVocab":
        return _LlamaVocab(path)

    def piece(self, token: int) -> bytes:
        with self._lock:
            got = self._cache.get(token)
            if got is None:
                got = self._cache[token] = self._piece(token, 64)
            return got

    def count(self, text: str) -> int:
        data = text.encode("utf-8")
        buf = (self._llama.llama_token * (len(data) + 8))()  # never more tokens than bytes
        with self._lock:
            n = self._llama.llama_tokenize(self._vocab, data, len(data), buf, len(buf), False, False)
        return abs(n)

    def _piece(self, token: int, size: int) -> bytes:
        buf = ctypes.create_string_buffer(size)
        n = self._llama.llama_token_to_piece(self._vocab, token, buf, size, 0, False)
        if n < 0:
            return self._piece(token, -n)
        return buf.raw[:n]
