"""A helper for tests that run a real engine: the token ids of a whole generation and its ``Done``."""

from __future__ import annotations

from app.protocol.types import Delta, GenerateRequest


def ids_and_done(engine, request: GenerateRequest):
    """``(token ids, Done)`` of ``request`` on ``engine`` (an ``Engine``); raises ``AssertionError`` when the
    stream ends without ``Done``."""
    ids: list[int] = []
    for ev in engine.generate(request):
        if isinstance(ev, Delta):
            ids += ev.token_ids
        else:
            return ids, ev
    raise AssertionError("the stream ended without Done")
