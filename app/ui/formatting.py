"""Text the window shows, computed without Qt: sizes, the status strip, the context tooltip, date groups."""

from __future__ import annotations

from datetime import date, datetime, timezone
from pathlib import PureWindowsPath
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


def file_name(path: str) -> str:
    """The last part of a document's path, for display (``/home/a/report.pdf`` → ``report.pdf``).

    Parsed as a Windows path on every platform because ``PureWindowsPath`` splits on both ``/`` and ``\\``: a
    path stored on Windows (an imported conversation, a shared database) shows its file name on Linux too.
    Model ids are not file names: use ``app.catalog.registry.model_id`` for those."""
    return PureWindowsPath(path).name


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


def disk_cache_off(metrics: dict[str, Any]) -> str:
    """The answer's ``cache_error`` when it says the prefix cache's disk tier is off, else ""."""
    err = str(metrics.get("cache_error") or "")
    return err if err.startswith("disk cache off") else ""


def status_texts(metrics: dict[str, Any]) -> dict[str, str]:
    """The status strip's labels for one answer's ``Metrics`` dict (empty dict → dashes)."""
    if not metrics:
        return {"ttft": "TTFT –", "decode": "decode –", "reused": "reused –", "thinking": ""}
    prompt = int(metrics.get("prompt_tokens", 0))
    cached = int(metrics.get("cached_tokens", 0))
    src = metrics.get("cache_source", "none")
    reused = f"reused {cached}/{prompt} prompt tokens" + (f" ({src})" if cached and src != "none" else "")
    if disk_cache_off(metrics):
        reused += " · disk cache off"  # the reason is in the label's tooltip (StatusStrip.show_answer)
    return {"ttft": f"TTFT {metrics.get('ttft_s', 0.0) * 1000:.0f} ms",
            "decode": f"decode {metrics.get('decode_tps', 0.0):.1f} tok/s",
            "reused": reused, "thinking": thinking_text(metrics)}


def seconds(s: float) -> str:
    """0.0123 → "12 ms", 2.345 → "2.3 s"."""
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s"


def thinking_text(metrics: dict[str, Any]) -> str:
    """The strip's thinking label for one answer's ``Metrics`` dict: thinking and answer tokens and the time to
    first answer token (TTFAT), or "" when the answer had no thinking (no budget and no thinking tokens)."""
    if not metrics or (not metrics.get("reasoning_tokens") and metrics.get("reasoning_budget") is None):
        return ""
    ttfat = metrics.get("ttfat_s")
    first = f"TTFAT {seconds(float(ttfat))}" if ttfat is not None else "TTFAT –"
    return (f"thinking {int(metrics.get('reasoning_tokens') or 0)} tok · answer "
            f"{int(metrics.get('answer_tokens') or 0)} tok · {first}")


def speculative_text(metrics: dict[str, Any]) -> str:
    """How the answer was decoded speculatively (docs/speculative.md), for the decode speed's tooltip:
    ``"Speculative decoding: prompt lookup, 12 of 20 guesses kept in 9 steps"``; "" when it was not
    (``spec_mode`` None)."""
    mode = metrics.get("spec_mode") if metrics else None
    if not mode:
        return ""
    return (f"Speculative decoding: {str(mode).replace('_', ' ')}, {_int(metrics, 'spec_accepted')} of "
            f"{_int(metrics, 'spec_drafted')} guesses kept in {_int(metrics, 'spec_steps')} steps")


def agreement_text(vote: dict[str, Any] | None) -> str:
    """The line under an answer chosen by self-consistency (its ``hearth.self_consistency`` vote dict): how
    many samples agree on the answer; "" for an answer of one sample."""
    if not vote or int(vote.get("n") or 1) <= 1:
        return ""
    n = int(vote["n"])
    if vote.get("no_answer") or vote.get("answer") is None:
        return f"Self-consistency: none of the {n} samples gave a number to compare; the first is shown"
    k = int((vote.get("counts") or {}).get(vote["answer"], 0))
    tie = " (a tie, the earliest wins)" if vote.get("tie") else ""
    return (f"Self-consistency: {k} of {n} samples agree on {vote['answer']} "
            f"(agreement {float(vote.get('agreement') or 0):.0%}){tie}")


REASONING_NOTES = {"budget": "budget reached", "deadline": "time limit reached", "user": "stopped by you"}


def reasoning_note(stopped_by: str | None, unclosed: bool = False) -> str:
    """Why thinking ended, when Hearth ended it or it never closed ("" when the model ended it)."""
    if stopped_by in REASONING_NOTES:
        return REASONING_NOTES[stopped_by]
    return "never closed" if unclosed else ""


def thinking_label(tokens: int | None, streaming: bool, expanded: bool, note: str = "") -> str:
    """The expander over an answer's thinking: "Thinking… (12 tokens)" while it streams, then
    "Thinking · 12 tokens · budget reached ▸" (▾ when open)."""
    n = "" if tokens is None else f"{tokens} token" + ("" if tokens == 1 else "s")
    if streaming:
        return f"Thinking… ({n})" if n else "Thinking…"
    parts = ["Thinking"] + ([n] if n else []) + ([note] if note else [])
    return " · ".join(parts) + (" ▾" if expanded else " ▸")


_PARTS = (("System prompt", "system"), ("Summaries of older turns", "summaries"), ("Recent turns", "history"),
          ("Document evidence", "evidence"), ("Your message", "user"),
          ("This turn's tool calls and results", "tools"), ("Tool definitions", "tool_definitions"),
          ("Chat template (role markers, BOS)", "template"))


def _int(d: dict[str, Any] | None, key: str) -> int:
    """``d[key]`` as an int; 0 when ``d`` is None or empty, or the key is missing or None."""
    return int((d or {}).get(key, 0) or 0)


def context_usage(breakdown: dict[str, Any], metrics: dict[str, Any] | None = None) -> tuple[int, int]:
    """``(tokens used, n_ctx)`` of the last answer.

    Used: the answer's real counts when its ``metrics`` has them (``prompt_tokens``: the templated prompt as the
    engine evaluated it, ``completion_tokens``: the answer); otherwise the context builder's per-part estimate
    (``breakdown``: system, summaries, history, evidence, user) plus the answer. The estimate counts each part's
    text alone, without the chat template around it, so it can read low (the strip once showed 16 after a
    47-token prompt): it is only the fallback for answers stored without metrics. ``n_ctx`` from the breakdown
    (0 when there is none)."""
    n_ctx = _int(breakdown, "n_ctx")
    completion = _int(metrics, "completion_tokens")
    if metrics and metrics.get("prompt_tokens") is not None:
        return _int(metrics, "prompt_tokens") + completion, n_ctx
    return sum(_int(breakdown, key) for _, key in _PARTS) + completion, n_ctx


def context_bar(breakdown: dict[str, Any], metrics: dict[str, Any] | None = None,
                model_n_ctx: int | None = None) -> tuple[int, int, str]:
    """The status strip's context bar as ``(value, maximum, text)``, in tokens.

    After an answer: its usage (``context_usage``) out of its n_ctx. Before any answer (no breakdown): 0 used
    out of ``model_n_ctx``, the loaded model's window; with no model either, an empty bar reading "context —"
    (never a made-up maximum such as "/ 1")."""
    used, n_ctx = context_usage(breakdown, metrics) if breakdown else (0, 0)
    n_ctx = n_ctx or int(model_n_ctx or 0)
    if n_ctx <= 0:
        return 0, 1, "context —"
    return min(used, n_ctx), n_ctx, f"context {used} / {n_ctx} tokens"


def context_tooltip(breakdown: dict[str, Any], metrics: dict[str, Any] | None = None) -> str:
    """Multi-line breakdown of the context window for the bar's tooltip (tokens): the total as in
    ``context_usage``, the prompt as the model counted it, then the builder's estimate per part."""
    if not breakdown:
        return "No answer yet: the context breakdown appears after the first answer."
    used, n_ctx = context_usage(breakdown, metrics)
    lines = [f"Context: {used} / {n_ctx} tokens"]
    if metrics and metrics.get("prompt_tokens") is not None:
        lines.append(f"  Prompt, as the model counted it (with the chat template): {_int(metrics, 'prompt_tokens')}")
        # answers since the turn pipeline carry an exact breakdown (its ``template`` part); older ones an estimate
        lines.append("  Per part:" if "template" in breakdown else "  Estimated per part:")
    lines += [f"  {label}: {_int(breakdown, key)}" for label, key in _PARTS
              if key not in ("template", "tools", "tool_definitions") or key in breakdown]
    lines.append(f"  Answer: {_int(metrics, 'completion_tokens')}")
    lines.append(f"  Reserved for the answer: {_int(breakdown, 'reserved')}")
    lines.append(f"  Free: {_int(breakdown, 'free')}")
    return "\n".join(lines)


def model_label(entry: Any, preparing: bool = False) -> str:
    """The models list's text for a ``registry.ModelEntry``: its id, what it is, and its size; a file not
    there yet (the bundled model before it is assembled) says "preparing…" while it is being loaded
    (``preparing``), else "not installed yet", never "unusable · 0 B"."""
    name = entry.id
    if entry.bundled:
        name += "  (bundled · small base model for trying things out)"
    elif entry.base_model is False:
        name += "  (chat)"
    if not entry.installed:
        return name + ("  · preparing…" if preparing else "  · not installed yet")
    if entry.error:
        name += "  ⚠ unusable"
    return f"{name} · {human_bytes(entry.size_bytes)}"


def tools_indicator(tools: list[Any], servers: int) -> tuple[str, str]:
    """The chat header's tools note as ``(text, tooltip)``: ``tools`` the enabled tools of the running MCP
    servers (``McpHub.tools()``), ``servers`` how many are configured. ``("", "")`` when none is configured
    (the model is offered nothing)."""
    if servers <= 0:
        return "", ""
    if not tools:
        return ("Tools: none ready", f"{servers} MCP server{'s' if servers != 1 else ''} configured, none running "
                "with a tool switched on: the model is offered no tools. See the Tools page.")
    by_server: dict[str, list[str]] = {}
    for t in tools:
        by_server.setdefault(t.server, []).append(t.name + (" (always allowed)" if t.always_allowed else ""))
    n = len(tools)
    lines = [f"The model is offered {n} tool{'s' if n != 1 else ''}; each call asks you first unless you "
             "allowed it always. Switch them off on the Tools page."]
    lines += [f"{server}: {', '.join(names)}" for server, names in by_server.items()]
    return f"⚒ Tools on: {n}", "\n".join(lines)


def documents_indicator(paths: list[str] | None) -> tuple[str, str]:
    """The chat header's documents note as ``(text, tooltip)``: ``paths`` the chat's documents (None: every
    indexed document, a chat from before documents were per chat; []: none, the note hidden)."""
    if paths is None:
        return "▤ All documents", "This chat searches every indexed document (untick some on the Documents page)."
    if not paths:
        return "", ""
    n = len(paths)
    names = [file_name(p) for p in paths[:12]] + ([f"… and {n - 12} more"] if n > 12 else [])
    return (f"▤ Documents: {n}", f"This chat searches {n} document{'s' if n != 1 else ''}:\n" + "\n".join(names))
