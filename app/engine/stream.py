"""What every request stream shares, local or remote: the stream handle, the engine's counters and the
percentile used for ITL (docs/engine.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from app.protocol.types import Delta, Done


# ------------------------------------------------------------------------------------------------------
# parent handle
# ------------------------------------------------------------------------------------------------------
@dataclass
class EngineStats:
    """Counters since the engine was created (for /metrics and the UI)."""

    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    crashes: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


class StreamHandle:
    """What every request stream shares (``Generation``, ``remote.RemoteGeneration``): iterate it for ``Delta``
    events and a final ``Done`` (``_iter``), ``result()`` drains it. Subclasses set ``_iter`` and ``done``."""

    _iter: Iterator[Delta | Done]
    done: Done | None

    def __iter__(self) -> Iterator[Delta | Done]:
        return self._iter

    def __next__(self) -> Delta | Done:
        return next(self._iter)

    def result(self) -> Done:
        """Drain the stream; the ``Done``."""
        for _ev in self._iter:
            pass
        assert self.done is not None
        return self.done


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
