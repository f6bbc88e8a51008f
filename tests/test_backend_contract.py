"""Every chat backend implements ``app.protocol.backend.Backend`` (and its stream, rendered prompt, tool dialect
and counters their protocols): each protocol member exists with a compatible signature, checked here at run
time; ``mypy`` (``[tool.mypy]`` files) checks the typed assignments of ``_typed`` statically. Pure logic: no
model, no remote."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from fakes import FakeEngine

from app.engine.chat.templates import RenderedPrompt
from app.engine.chat.tool_formats import FORMATS, ToolFormat
from app.engine.local.engine import Engine, Generation
from app.engine.remote.engine import RemoteEngine, RemoteGeneration
from app.engine.stream import EngineStats
from app.protocol.backend import Backend, BackendStats, BackendStream, RenderedText, ToolDialect
from app.protocol.types import GenerateRequest


def _typed(engine: Engine, remote: RemoteEngine, fake: FakeEngine, request: GenerateRequest) -> list[Backend]:
    """Not run: mypy checks that each value fits the protocol it is assigned to."""
    streams: list[BackendStream] = [engine.generate(request), remote.generate(request), fake.generate(request)]
    rendered: RenderedText = RenderedPrompt("text", "name")
    dialect: ToolDialect = FORMATS["hermes"]
    stats: BackendStats = EngineStats()
    del streams, rendered, dialect, stats
    return [engine, remote, fake]


def protocol_members(proto: type) -> dict[str, Any]:
    """The members a protocol declares (its own ``__dict__``, less typing's and Python's machinery)."""
    skip = {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__parameters__", "__annotations__",
            "__init__", "__subclasshook__", "__abstractmethods__", "__non_callable_proto_members__",
            "__protocol_attrs__", "__firstlineno__", "__static_attributes__", "__orig_bases__", "_abc_impl",
            "_is_protocol", "_is_runtime_protocol"}
    return {k: v for k, v in vars(proto).items() if k not in skip}


def signature_gaps(proto_fn: Any, impl_fn: Any) -> list[str]:
    """Why ``impl_fn`` cannot be called as ``proto_fn`` is: each protocol parameter at its place with its name
    and kind (a default where the protocol has one); the implementation's extra parameters optional."""
    want = list(inspect.signature(proto_fn).parameters.values())
    got = list(inspect.signature(impl_fn).parameters.values())
    gaps = []
    for i, p in enumerate(want):
        q = got[i] if i < len(got) else None
        if q is None or q.name != p.name or q.kind != p.kind:
            gaps.append(f"parameter {i} should be {p.name} ({p.kind.description}), is {q}")
        elif p.default is not inspect.Parameter.empty and q.default is inspect.Parameter.empty:
            gaps.append(f"parameter {p.name} should have a default")
    for q in got[len(want):]:
        if q.default is inspect.Parameter.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD):
            gaps.append(f"extra parameter {q.name} has no default")
    return gaps


def contract_gaps(proto: type, impl: Any) -> list[str]:
    """Each protocol member ``impl`` (a class or an instance) lacks or has with an incompatible signature:
    a property may be any attribute (of a class: one it or a base declares); a method must be a method with a
    compatible signature."""
    cls = impl if isinstance(impl, type) else type(impl)
    declared = {n for c in cls.__mro__ for n in vars(c).get("__annotations__", {})}
    gaps = []
    for name, member in protocol_members(proto).items():
        if not hasattr(impl, name) and not (isinstance(member, property) and name in declared):
            gaps.append(f"{cls.__name__}.{name} is missing")
        elif callable(member) and not isinstance(member, property):
            ours = inspect.getattr_static(cls, name, None)
            if not callable(ours):
                gaps.append(f"{cls.__name__}.{name} is not a method")
            else:
                gaps += [f"{cls.__name__}.{name}: {g}" for g in signature_gaps(member, getattr(cls, name))]
    return gaps


@pytest.fixture
def backends():
    """A local engine (not loaded: no model is read), a remote one (never contacted) and the fake."""
    fake = FakeEngine()
    made = [Engine("no-such-model.gguf"), RemoteEngine("peer", "http://127.0.0.1:9"), fake]
    yield made
    fake.close()


def test_the_protocol_states_what_callers_use():
    members = set(protocol_members(Backend))
    assert {"generate", "render", "tokenize", "count_tokens", "detokenize", "token_piece_bytes", "tool_format",
            "info", "settings", "model_path", "stats", "n_parallel", "alive", "load", "close", "queue_depth",
            "active", "cache_stats", "complete"} <= members
    assert {"__iter__", "result", "cancel", "close", "stop_thinking", "done"} <= set(protocol_members(BackendStream))


def test_every_backend_implements_the_protocol(backends):
    for backend in backends:
        assert contract_gaps(Backend, backend) == [], type(backend).__name__


@pytest.mark.parametrize("proto, impl", [(BackendStream, Generation), (BackendStream, RemoteGeneration),
                                         (RenderedText, RenderedPrompt("t", "n")), (ToolDialect, ToolFormat),
                                         (BackendStats, EngineStats())])
def test_the_values_backends_return_implement_theirs(proto, impl):
    assert contract_gaps(proto, impl) == []


def test_a_backend_that_lacks_a_member_or_differs_in_a_signature_is_caught():
    class Partial:
        model_path = "m.gguf"

        def tokenize(self, text: str, add_bos: bool, special: bool = False) -> list[int]:  # no default
            return []

        def count_tokens(self, text: str, extra: int) -> int:  # a required extra parameter
            return 0

        render = "not a method"

    gaps = contract_gaps(Backend, Partial())
    assert "Partial.generate is missing" in gaps
    assert "Partial.settings is missing" in gaps
    assert "Partial.tokenize: parameter add_bos should have a default" in gaps
    assert "Partial.count_tokens: extra parameter extra has no default" in gaps
    assert "Partial.render is not a method" in gaps
    assert not any(g.startswith("Partial.model_path") for g in gaps)


def test_the_fake_answers_through_the_protocol(backends):
    """The members the contract names work on the fake as callers use them (token counts of its one
    token per character vocabulary)."""
    backend: Backend = backends[2]
    rendered = backend.render(GenerateRequest(prompt="hi"))
    assert backend.tokenize(rendered.text, add_bos=rendered.add_bos) == [0, ord("h"), ord("i")]
    assert backend.count_tokens("hello") == 5
    assert backend.detokenize([ord("o"), ord("k")]) == "ok"
    assert backend.token_piece_bytes(ord("é")) == "é".encode()
    stream = backend.generate(GenerateRequest(prompt="x"))
    try:
        done = stream.result()
    finally:
        stream.close()
    assert done.text == "echo: x" and stream.done is done
    assert backend.stats.completed == 1 and backend.queue_depth() == 0 and backend.active() == 0
    assert backend.settings.n_ctx == 512 and backend.alive
