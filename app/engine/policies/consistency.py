"""Self-consistency's API object, ``hearth.self_consistency: {n, extract, verifier}``, read into a
``SelfConsistencySpec`` (``parse_self_consistency``; a bad value raises ``InvalidRequest`` naming the field),
and ``verify_safely``, which turns any verifier error into a rejection. The parts: ``regex_gate``, ``extract``,
``checks``, ``safe_eval``, ``program``; the vote and its cost: ``vote`` (docs/reasoning.md)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Union

from app.engine.policies.checks import TARGETS, JsonSchemaCheck, RegexCheck, Verdict, _schema_patterns
from app.engine.policies.extract import PARAM, Extractor, LastNumber, _only, parse_extractor
from app.engine.policies.program import MAX_COMMAND_TIMEOUT_S, CommandCheck
from app.engine.policies.regex_gate import MAX_SCAN_CHARS, regex_gate
from app.engine.policies.safe_eval import PythonCheck, _Unsafe, check_expression
from app.engine.structured.schema_check import check_schema
from app.errors import InvalidRequest

log = logging.getLogger(__name__)

MAX_N = 16


Verifier = Union[RegexCheck, JsonSchemaCheck, PythonCheck, CommandCheck]
_KINDS = ("regex", "json_schema", "python", "command")
_FIELDS = {"regex": {"regex", "on"}, "json_schema": {"json_schema", "on"}, "python": {"python"},
           "command": {"command", "timeout_s", "on"}}


def parse_verifier(raw: Any, param: str = PARAM + ".verifier", *, allow_command: bool = False) -> Verifier | None:
    """``None`` | ``{"regex": str, "on"}`` | ``{"json_schema": {...}, "on"}`` | ``{"python": str}`` |
    ``{"command": [argv...], "timeout_s": float, "on"}`` → a ``Verifier`` (or None); ``on`` is "answer"
    (default) or "text". Raise ``InvalidRequest(param=param)`` for anything else, and for a command unless
    ``allow_command`` (a command verifier runs programs: only a caller the person trusts may ask for one)."""
    if raw is None:
        return None
    kinds = [k for k in _KINDS if isinstance(raw, dict) and k in raw]
    if len(kinds) != 1:
        raise InvalidRequest("verifier must be null or an object with exactly one of "
                             f"{', '.join(_KINDS)}, got {raw!r}"[:300], param=param)
    kind = kinds[0]
    _only(raw, _FIELDS[kind], param)
    on = raw.get("on", "answer")
    if on not in TARGETS:
        raise InvalidRequest(f"verifier.on must be \"answer\" or \"text\", got {on!r}", param=param)
    if kind == "regex":
        regex_gate(raw["regex"], param, "verifier.regex")
        return RegexCheck(raw["regex"], on)
    if kind == "json_schema":
        return _parse_schema_check(raw["json_schema"], on, param)
    if kind == "python":
        check_expression(raw["python"], param)
        return PythonCheck(raw["python"])
    return _parse_command(raw, on, param, allow_command)


def _parse_schema_check(schema: Any, on: str, param: str) -> JsonSchemaCheck:
    check_schema(schema, param=param, where="verifier.json_schema")
    windows = [regex_gate(p, param, "a json_schema pattern")[1].search_window for p in _schema_patterns(schema)]
    return JsonSchemaCheck(schema, on, min(windows, default=MAX_SCAN_CHARS))


def _parse_command(raw: dict, on: str, param: str, allow_command: bool) -> CommandCheck:
    if not allow_command:
        raise InvalidRequest("command verifiers are turned off here (they run programs on this computer); "
                             "use regex, json_schema or python", param=param)
    argv = raw["command"]
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a and "\0" not in a for a in argv):
        raise InvalidRequest(f"verifier.command must be a non-empty list of strings (argv), got {argv!r}",
                             param=param)
    timeout_s = raw.get("timeout_s", 10.0)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) \
            or not 0 < timeout_s <= MAX_COMMAND_TIMEOUT_S:
        raise InvalidRequest(f"verifier.timeout_s must be > 0 and <= {MAX_COMMAND_TIMEOUT_S:g} seconds, "
                             f"got {timeout_s!r}", param=param)
    return CommandCheck(tuple(argv), float(timeout_s), on)


def verify_safely(verifier: Verifier, answer: str | None, text: str) -> Verdict:
    """``verifier.verify(answer, text)``, with any error turned into a rejection that names it: a verifier never
    raises into the vote."""
    try:
        return verifier.verify(answer, text)
    except _Unsafe as exc:
        return Verdict(False, f"the python check was refused: {exc}")
    except Exception as exc:  # a verifier must never break the vote  # noqa: BLE001
        log.debug("verifier %s failed", type(verifier).__name__, exc_info=True)
        return Verdict(False, f"the verifier failed: {type(exc).__name__}: {str(exc)[:200]}")


# --- the spec --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SelfConsistencySpec:
    """``hearth.self_consistency``: ``n`` samples (1..``MAX_N``), how to ``extract`` each answer, an optional
    ``verifier``."""

    n: int
    extract: Extractor = field(default_factory=LastNumber)
    verifier: Verifier | None = None

    def to_api(self) -> dict:
        return {"n": self.n, "extract": self.extract.to_api(),
                "verifier": self.verifier.to_api() if self.verifier else None}


def parse_self_consistency(raw: Any, *, allow_command: bool = False, param: str = PARAM) -> SelfConsistencySpec:
    """Validate the API object ``{"n": 1..16, "extract": ... = "last_number", "verifier": ... = null}``.

    Raises ``InvalidRequest`` with ``param`` = ``hearth.self_consistency`` (not an object, unknown field),
    ``….n``, ``….extract`` or ``….verifier`` (``parse_extractor``, ``parse_verifier``)."""
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{param} must be an object {{n, extract, verifier}}, got {raw!r}"[:300], param=param)
    unknown = sorted(set(raw) - {"n", "extract", "verifier"})
    if unknown:
        raise InvalidRequest(f"{param}: unknown field {unknown[0]!r} (allowed: n, extract, verifier)",
                             param=f"{param}.{unknown[0]}")
    n = raw.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise InvalidRequest(f"{param}.n must be an integer >= 1 and <= {MAX_N}, got {n!r}", param=f"{param}.n")
    return SelfConsistencySpec(n, parse_extractor(raw.get("extract", "last_number"), f"{param}.extract"),
                               parse_verifier(raw.get("verifier"), f"{param}.verifier", allow_command=allow_command))


def sample_seeds(n: int, seed: int | None) -> list[int | None]:
    """Seeds for ``n`` samples: ``seed, seed+1, …`` (mod 2^32) so that a seeded request is reproducible and
    its samples differ; all None (random) without a seed."""
    return [None] * n if seed is None else [(seed + i) % 2**32 for i in range(n)]
