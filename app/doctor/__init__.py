"""``hearth doctor``: is this machine ready for Hearth, and if not, the exact fix.

Each check is a small function returning a ``Check`` (name, status, one-line summary, the fix as a command or
a sentence, details for ``--json``). Statuses: ``ok``; ``warn`` (Hearth works, something is worse than it
could be); ``fail`` (something will not work until fixed); ``info`` (nothing to judge, e.g. no service
installed). A check that raises becomes a ``fail`` naming the exception, so doctor itself never crashes.

Qt-free: the Qt check (``app.doctor.qt``) asks ``ldd`` and a child process. The checks live in
``app.doctor.checks``; ``run_checks`` runs them in a fixed order, ``format_text`` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

STATUSES = ("ok", "warn", "fail", "info")


@dataclass
class Check:
    """One result. ``fix``: what to run or do (empty when nothing is needed)."""

    name: str
    status: str
    summary: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "summary": self.summary, "fix": self.fix,
                "details": self.details}


def run_checks(only: list[str] | None = None, **options: Any) -> list[Check]:
    """Run the checks (``only``: their names, default all) in order; ``options`` go to every check that takes
    them (``qt_search_dirs``, ``env``)."""
    from app.doctor import checks

    out = []
    for name, fn in checks.ALL:
        if only and name not in only:
            continue
        out.append(_guarded(name, fn, options))
    return out


def _guarded(name: str, fn: Callable[..., Check], options: dict[str, Any]) -> Check:
    import inspect

    wanted = {k: v for k, v in options.items() if k in inspect.signature(fn).parameters}
    try:
        return fn(**wanted)
    except Exception as exc:  # noqa: BLE001 - doctor reports every failure instead of dying on it
        return Check(name, "fail", f"the check itself failed: {type(exc).__name__}: {exc}",
                     "report this with `hearth doctor --json` output")


MARKS = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "info": "info"}


def format_text(results: list[Check]) -> str:
    """The human report: one line per check, its fix indented under it."""
    width = max((len(c.name) for c in results), default=0)
    lines = []
    for c in results:
        lines.append(f"[{MARKS[c.status]}] {c.name.ljust(width)}  {c.summary}")
        pad = " " * (width + 9)
        for i, fix_line in enumerate(c.fix.splitlines() if c.status != "ok" else []):
            lines.append(f"{pad}{'→ ' if i == 0 else '  '}{fix_line}")
    bad = [c for c in results if c.status == "fail"]
    warn = [c for c in results if c.status == "warn"]
    lines.append("")
    lines.append(f"{len(bad)} failed, {len(warn)} warning(s), {len(results) - len(bad) - len(warn)} fine"
                 if bad or warn else "Everything Hearth needs is in place.")
    return "\n".join(lines)


def exit_code(results: list[Check]) -> int:
    """1 when a check failed, else 0."""
    return 1 if any(c.status == "fail" for c in results) else 0
