"""Helpers for tests that run a real engine: the token ids of a whole generation and its ``Done``; the engine
behind the port."""

from __future__ import annotations

from contextlib import contextmanager

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


@contextmanager
def served(model, n_ctx: int = 2048, max_queue: int = 4):
    """A real engine on ``model`` (``n_ctx`` tokens, ``max_queue`` waiting requests) behind the port on a free
    loopback port: yields the ``ServerThread`` (its ``url``); both are closed whatever happens."""
    from app.engine.local.engine import Engine
    from app.protocol.types import LoadSettings
    from app.server import ServerThread, create_app
    from app.settings import ServerSettings

    eng = Engine(model, LoadSettings(n_ctx=n_ctx), max_queue=max_queue)
    eng.load()
    try:
        with ServerThread(create_app(eng, ServerSettings())) as srv:
            yield srv
    finally:
        eng.close()
