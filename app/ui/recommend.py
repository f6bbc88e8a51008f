"""The curated list of instruction-tuned models (``resources/recommended_models.json``) sized to this machine.

A model is recommended when its ``min_memory_bytes`` (file + KV cache at 4096 tokens + compute, see the JSON's
note) fits in ``FITS_FRACTION`` of the larger of free RAM and free VRAM (the same rule as
``app.engine.memory_estimate``); "tight" up to all of it; otherwise "won't fit". The largest models that fit come
first: on a bigger machine the better model is the one to try. Without a GPU (no VRAM figure), files above
``CPU_MAX_FILE_BYTES`` are left out: they fit in RAM but answer at a few tokens per second on a CPU.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from app.engine.memory_estimate import FITS_FRACTION

CPU_MAX_FILE_BYTES = 5_000_000_000  # ~8B parameters at Q4_K_M: still usable on a CPU


def resources_dir() -> Path:
    """``resources/`` next to the package (source tree) or inside a PyInstaller bundle."""
    base = getattr(sys, "_MEIPASS", None)
    if base:
        return Path(base) / "resources"
    return Path(__file__).resolve().parents[2] / "resources"


@dataclass(frozen=True)
class Recommendation:
    """One curated model and its verdict on this machine ("fits" / "tight" / "won't fit" / "unknown")."""

    id: str
    name: str
    repo: str
    file: str
    size_bytes: int
    min_memory_bytes: int
    blurb: str
    license: str
    verdict: str = "unknown"


def load_catalog(path: Path | None = None) -> list[Recommendation]:
    data = json.loads((path or resources_dir() / "recommended_models.json").read_text(encoding="utf-8"))
    return [Recommendation(**{k: m[k] for k in Recommendation.__dataclass_fields__ if k in m})
            for m in data["models"]]


def verdict(need: int, available: int | None) -> str:
    if not available:
        return "unknown"
    if need <= FITS_FRACTION * available:
        return "fits"
    return "tight" if need <= available else "won't fit"


def recommend(catalog: list[Recommendation], ram_bytes: int | None, vram_bytes: int | None = None,
              limit: int = 4) -> list[Recommendation]:
    """Up to ``limit`` models for this machine: those that fit, largest first; if none fits, the smallest."""
    budget = max(ram_bytes or 0, vram_bytes or 0) or None
    pool = [r for r in catalog if vram_bytes or r.size_bytes <= CPU_MAX_FILE_BYTES]
    judged = [Recommendation(**{**r.__dict__, "verdict": verdict(r.min_memory_bytes, budget)}) for r in pool]
    fitting = sorted((r for r in judged if r.verdict == "fits"), key=lambda r: -r.min_memory_bytes)
    if fitting:
        return fitting[:limit]
    return sorted(judged, key=lambda r: r.min_memory_bytes)[:limit]
