"""Text the window shows, computed without Qt: sizes, the status strip, the context tooltip, date groups."""

from __future__ import annotations

from datetime import date, datetime, timezone
from typing import Any

DATE_GROUPS = ("Today", "Yesterday", "Previous 7 days", "Previous 30 days", "Older")


def human_bytes(n: int | float | None) -> str:
    """1536 → "1.5 KiB"; None → "?"."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def date_group(iso: str, today: date | None = None) -> str:
    """Which sidebar group a conversation updated at ``iso`` (UTC ISO 8601) falls in, in local time."""
    try:
        when = datetime.fromisoformat(iso)
    except ValueError:
        return DATE_GROUPS[-1]
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    day = when.astimezone().date()
    today = today or datetime.now().astimezone().date()
    age = (today - day).days
    if age <= 0:
        return "Today"
    if age == 1:
        return "Yesterday"
    if age <= 7:
        return "Previous 7 days"
    if age <= 30:
        return "Previous 30 days"
    return "Older"


def status_texts(metrics: dict[str, Any]) -> dict[str, str]:
    """The status strip's labels for one answer's ``Metrics`` dict (empty dict → dashes)."""
    if not metrics:
        return {"ttft": "TTFT –", "decode": "decode –", "reused": "reused –"}
    prompt = int(metrics.get("prompt_tokens", 0))
    cached = int(metrics.get("cached_tokens", 0))
    src = metrics.get("cache_source", "none")
    reused = f"reused {cached}/{prompt} prompt tokens" + (f" ({src})" if cached and src != "none" else "")
    return {"ttft": f"TTFT {metrics.get('ttft_s', 0.0) * 1000:.0f} ms",
            "decode": f"decode {metrics.get('decode_tps', 0.0):.1f} tok/s",
            "reused": reused}


def context_usage(breakdown: dict[str, Any], completion_tokens: int = 0) -> tuple[int, int]:
    """``(tokens used, n_ctx)``: the prompt (all parts of the breakdown) plus the answer so far."""
    n_ctx = int(breakdown.get("n_ctx", 0) or 0)
    parts = ("system", "summaries", "history", "evidence", "user")
    used = sum(int(breakdown.get(k, 0) or 0) for k in parts) + int(completion_tokens)
    return used, n_ctx


def context_tooltip(breakdown: dict[str, Any], completion_tokens: int = 0) -> str:
    """Multi-line breakdown of the context window for the bar's tooltip (tokens)."""
    if not breakdown:
        return "No answer yet: the context breakdown appears after the first answer."
    used, n_ctx = context_usage(breakdown, completion_tokens)
    rows = [("System prompt", "system"), ("Summaries of older turns", "summaries"), ("Recent turns", "history"),
            ("Document evidence", "evidence"), ("Your message", "user")]
    lines = [f"Context: {used} / {n_ctx} tokens"]
    lines += [f"  {label}: {int(breakdown.get(key, 0) or 0)}" for label, key in rows]
    lines.append(f"  Answer: {completion_tokens}")
    lines.append(f"  Reserved for the answer: {int(breakdown.get('reserved', 0) or 0)}")
    lines.append(f"  Free: {int(breakdown.get('free', 0) or 0)}")
    return "\n".join(lines)


def model_label(entry: Any) -> str:
    """The models list's text for a ``registry.ModelEntry``."""
    name = entry.id
    if entry.bundled:
        name += "  (bundled · small base model for trying things out)"
    elif entry.base_model is False:
        name += "  (chat)"
    if entry.error:
        name += "  ⚠ unusable"
    return name
