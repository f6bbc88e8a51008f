"""The inference engine's public face: the backends (``Engine`` for a GGUF file in a child process,
``RemoteEngine`` for another server), the ``ModelPool`` that keeps several, their streams, and the
test-time-compute policies over any backend. No Qt here; only the local runtime's child process maps
llama.cpp. The subpackages and their order are in docs/architecture.md.

Names load on first use (PEP 562), so importing one subpackage does not start the others.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_FACE = {
    "Engine": "app.engine.local.engine",
    "Generation": "app.engine.local.engine",
    "EngineStats": "app.engine.stream",
    "StreamHandle": "app.engine.stream",
    "RemoteEngine": "app.engine.remote.engine",
    "ModelPool": "app.engine.pool",
    "ModelBusy": "app.engine.pool",
    "Lease": "app.engine.pool",
    "local_pool": "app.engine.pool",
    "SelfConsistencyRun": "app.engine.policies.self_consistency",
    "run_self_consistency": "app.engine.policies.self_consistency",
    "parse_self_consistency": "app.engine.policies.consistency",
}

__all__ = [
    "Engine", "EngineStats", "Generation", "Lease", "ModelBusy", "ModelPool", "RemoteEngine", "SelfConsistencyRun",
    "StreamHandle", "local_pool", "parse_self_consistency", "run_self_consistency",
]

if TYPE_CHECKING:
    from app.engine.local.engine import Engine, Generation
    from app.engine.policies.consistency import parse_self_consistency
    from app.engine.policies.self_consistency import SelfConsistencyRun, run_self_consistency
    from app.engine.pool import Lease, ModelBusy, ModelPool, local_pool
    from app.engine.remote.engine import RemoteEngine
    from app.engine.stream import EngineStats, StreamHandle


def __getattr__(name: str) -> Any:
    """``app.engine.<name>`` for a name of ``__all__``, imported from its module on first use; raises
    ``AttributeError`` for any other name."""
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module 'app.engine' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
