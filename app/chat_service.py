"""Application wiring: a stored conversation (``app.memory``) answered by the engine (``app.engine``),
optionally with evidence from the document index (``app.retrieval``).

``app.memory`` never imports the engine (STYLE.md: dependencies point one way); this module is the adapter
the CLI, the server and the desktop app share.
"""

from __future__ import annotations

import logging
from dataclasses import fields
from typing import Any, Iterator

from app.engine.types import ChatMessage, DecodingParams, GenerateRequest

log = logging.getLogger(__name__)


def engine_generate_fn(engine: Any, base: DecodingParams):
    """A ``generate_fn(messages, max_tokens, **opts)`` for ``ChatSession`` backed by ``engine``; ``opts``
    override fields of ``base`` (temperature, stop, seed…)."""

    def generate_fn(messages, max_tokens=None, **opts) -> Iterator[Any]:
        kw = {f.name: getattr(base, f.name) for f in fields(base)}
        kw["logit_bias"] = dict(base.logit_bias)
        kw.update({k: v for k, v in opts.items() if k in kw})
        kw["max_tokens"] = max_tokens
        gen = engine.generate(GenerateRequest(messages=tuple(messages), decoding=DecodingParams.make(**kw)))
        try:
            yield from gen
        finally:
            gen.close()

    return generate_fn


def engine_count_messages(engine: Any):
    """Exact token count of a message list once the chat template is applied (what the engine will see)."""

    def count(messages: list[ChatMessage]) -> int:
        rp = engine.render(GenerateRequest(messages=tuple(messages)))
        return len(engine.tokenize(rp.text, add_bos=rp.add_bos, special=True))

    return count


def open_chat_session(engine: Any, store: Any, *, decoding: DecodingParams, system_prompt: str = "",
                      max_tokens: int | None = None, model_id: str = "") -> Any:
    """A ``ChatSession`` for ``engine`` (loaded) and ``store`` (``app.memory.Store``).

    ``max_tokens``: tokens reserved for each answer (default: ``decoding.max_tokens`` or 256)."""
    from app.memory.chat_session import ChatSession

    n_ctx = engine.settings.n_ctx
    reserve = max_tokens or decoding.max_tokens or 256
    overhead = 5 if engine.info.get("template") in ("gemma", "transcript") else 6
    return ChatSession(store, engine_generate_fn(engine, decoding), engine.count_tokens, n_ctx=n_ctx,
                       max_tokens=reserve, system_prompt=system_prompt, model=model_id or engine.info.get("model", ""),
                       settings={"n_ctx": n_ctx, **{k: v for k, v in engine.settings.to_dict().items()
                                                    if k in ("type_k", "type_v", "flash_attn")}},
                       summary_options={"temperature": 0.0}, message_overhead=overhead,
                       count_messages=engine_count_messages(engine))
