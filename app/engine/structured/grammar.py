"""Constrained decoding with GBNF grammars, without ever letting a bad grammar crash the process.

llama-cpp-python 0.3.36's ``LlamaSampler.add_grammar`` adds whatever ``llama_sampler_init_grammar`` returns to
the sampler chain; for a grammar llama.cpp cannot parse that is NULL, and the chain then crashes
(docs/llama-cpp-notes.md). Here the pointer is checked first and a bad grammar becomes ``InvalidRequest``.
JSON schemas are turned into GBNF by llama-cpp-python's port of llama.cpp's ``json_schema_to_grammar``.

That port (``llama_cpp/llama_grammar.py``) is pure Python, but importing it as ``llama_cpp.llama_grammar``
runs the package's ``__init__``, which loads libllama into the importing process: the HTTP server converts
schemas, and only the engine children may map llama.cpp. So the file is loaded on its own, by path.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from app.errors import InvalidRequest


def schema_to_gbnf(schema: Any, where: str = "schema") -> str:
    """GBNF text for a JSON schema (dict). Raises ``InvalidRequest(param="response_format")`` when the schema
    is not an object or uses something the converter cannot compile; ``where`` names the schema in the
    message (``response_format.json_schema.schema``)."""
    json_schema_to_gbnf = _llama_grammar().json_schema_to_gbnf
    if not isinstance(schema, dict):
        raise InvalidRequest("response_format.json_schema.schema must be a JSON object",
                             param="response_format")
    check_bounds(schema, "response_format", where)
    schema = bounded_ints(schema)
    problem = _unbuildable(schema, where)
    if problem:
        raise InvalidRequest(f"cannot compile this JSON schema into a grammar: {problem}", param="response_format")
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # the converter raises bare Exceptions/KeyErrors/RecursionError
        raise InvalidRequest(f"cannot compile this JSON schema into a grammar: {type(exc).__name__}: {exc}",
                             param="response_format") from None


# The converter writes a bound of n as n nested groups: ``maxLength: 987654321`` took 23 GB before the kernel
# killed the server (found by a break-it test), and a grammar nested deeper than 256 is refused anyway
# (``schema_check.MAX_GRAMMAR_NESTING``). So bounds above this are refused before anything is built.
MAX_GRAMMAR_BOUND = 256
_BOUNDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


# The same for a ``pattern``'s quantifiers (``{n}``, ``{n,m}``, ``{n,}``): ``"^[a-z]{0,100000000}$"`` (205 bytes)
# blocked the event loop for 9.3 s and grew the server to 2.9 GB. And the bounds of one schema together: each
# unit of a bound writes about 8 characters of grammar, so 4096 of them stay within ``MAX_GRAMMAR_CHARS``'s
# order (a 64 kB schema of 256-bounds built 9 MB of grammar in 0.2 s before it was refused).
MAX_GRAMMAR_REPEATS = 4096
_QUANTIFIER = re.compile(r"\\.|\[(?:\\.|[^\]])*\]|\{([^}]*)\}", re.S)


def check_bounds(schema: Any, param: str, where: str = "schema") -> None:
    """Raise ``InvalidRequest(param=param)`` naming the place (``where.properties.x.pattern``), the bound and
    the limit when a repetition bound of ``schema`` (``minLength``… or a ``pattern`` quantifier) is over
    ``MAX_GRAMMAR_BOUND``, or all of them together over ``MAX_GRAMMAR_REPEATS``: checked before a grammar is
    built, since building one is what such a bound makes huge."""
    total = 0
    for path, bound in _repetitions(schema, where):
        if bound > MAX_GRAMMAR_BOUND:
            shown = bound if bound < 10**18 else "over 10**18"
            raise InvalidRequest(f"{path}: a repetition bound of {shown} is over the limit of {MAX_GRAMMAR_BOUND}",
                                 param=param)
        total += bound
    if total > MAX_GRAMMAR_REPEATS:
        raise InvalidRequest(f"{where}: its repetition bounds (minLength, maxItems, pattern quantifiers...) add "
                             f"up to {total}, over the limit of {MAX_GRAMMAR_REPEATS}", param=param)


def _repetitions(node: Any, path: str) -> Iterator[tuple[str, int]]:
    """``(place, bound)`` for every length/item bound and ``pattern`` quantifier number under ``node``."""
    if isinstance(node, list):
        for i, sub in enumerate(node):
            yield from _repetitions(sub, f"{path}[{i}]")
        return
    if not isinstance(node, dict):
        return
    for key in _BOUNDS:
        v = node.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            yield f"{path}.{key}", max(0, int(v))
    if isinstance(node.get("pattern"), str):
        yield from ((f"{path}.pattern", n) for n in pattern_bounds(node["pattern"]))
    for key, sub in node.items():
        if isinstance(sub, (dict, list)) and key not in _DATA_KEYS:
            yield from _repetitions(sub, f"{path}.{key}")


def pattern_bounds(pattern: str) -> Iterator[int]:
    """The numbers of every ``{n}`` / ``{n,m}`` / ``{n,}`` quantifier of a regular expression (outside escapes and
    character classes; a number too long to read counts as 10**18)."""
    for m in _QUANTIFIER.finditer(pattern):
        for part in (m.group(1) or "").split(","):
            digits = part.strip()
            if digits.isascii() and digits.isdigit():
                yield int(digits) if len(digits) <= 18 else 10**18


def _unbuildable(node: Any, path: str) -> str | None:
    """Why ``node`` (a schema) cannot become a grammar without building something huge or broken, or None:
    a length/item bound over ``MAX_GRAMMAR_BOUND``, or an empty ``enum`` (no value could match)."""
    if isinstance(node, list):
        for i, sub in enumerate(node):
            why = _unbuildable(sub, f"{path}[{i}]")
            if why:
                return why
        return None
    if not isinstance(node, dict):
        return None
    for key in _BOUNDS:
        v = node.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > MAX_GRAMMAR_BOUND:
            return f"{key} {v!r} at {path} is more than a grammar can enforce (at most {MAX_GRAMMAR_BOUND})"
    if node.get("enum") == []:
        return f"enum at {path} is empty (no value could match)"
    for key, sub in node.items():
        if isinstance(sub, (dict, list)) and key not in ("enum", "const", "default", "examples", "required"):
            why = _unbuildable(sub, f"{path}.{key}")
            if why:
                return why
    return None


# The converter ignores ``minimum``/``maximum``; an integer between bounds this close is written as the list of
# its values instead (an ``enum``, which it does enforce), so pydantic's ``Field(ge=1, le=5)`` is kept by the
# grammar itself. Wider ranges are left to the check after generation.
MAX_ENUM_RANGE = 64
RANGE_KEYS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
_DATA_KEYS = ("enum", "const", "default", "examples", "required")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def int_range(node: Any) -> range | list[int] | None:
    """The integers ``node`` allows when it is ``{"type": "integer"}`` with a lower and an upper bound
    (``minimum``/``exclusiveMinimum``, ``maximum``/``exclusiveMaximum``, numbers; an integer ``multipleOf``
    filters them) spanning at most ``MAX_ENUM_RANGE`` values; None for any other node (it may be empty)."""
    if not isinstance(node, dict) or node.get("type") != "integer" or "enum" in node or "const" in node:
        return None
    lo = _bound(node, "minimum", "exclusiveMinimum", math.ceil, 1)
    hi = _bound(node, "maximum", "exclusiveMaximum", math.floor, -1)
    step = node.get("multipleOf", 1)
    if lo is None or hi is None or not _number(step) or step != int(step) or step <= 0:
        return None
    if hi - lo + 1 > MAX_ENUM_RANGE:
        return None
    return [v for v in range(lo, hi + 1) if v % int(step) == 0]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _bound(node: dict, inclusive: str, exclusive: str, rounding: Any, nudge: int) -> int | None:
    """The tightest integer bound of ``node`` on one side (None when it has none, or a bound is not a number)."""
    found = []
    if inclusive in node:
        if not _number(node[inclusive]):
            return None
        found.append(int(rounding(node[inclusive])))
    if exclusive in node:
        v = node[exclusive]
        if not _number(v):
            return None
        # the first integer strictly past v: floor(v) + 1 from below, ceil(v) - 1 from above
        found.append(int(math.floor(v)) + 1 if nudge > 0 else int(math.ceil(v)) - 1)
    if not found:
        return None
    return max(found) if nudge > 0 else min(found)


def bounded_ints(node: Any) -> Any:
    """``node`` (a schema) with every integer of ``int_range`` written as ``{"enum": [its values]}`` (its
    other keywords, e.g. ``description``, kept); a new object, ``node`` is not changed."""
    if isinstance(node, list):
        return [bounded_ints(sub) for sub in node]
    if not isinstance(node, dict):
        return node
    values = int_range(node)
    if values is not None:
        node = {k: v for k, v in node.items() if k not in RANGE_KEYS and k != "type"} | {"enum": values}
    out = {}
    for key, sub in node.items():
        if key in _SCHEMA_MAPS and isinstance(sub, dict):  # name -> schema: every value is a schema
            out[key] = {name: bounded_ints(s) for name, s in sub.items()}
        else:
            out[key] = sub if key in _DATA_KEYS else bounded_ints(sub)
    return out


def json_object_gbnf() -> str:
    """GBNF for any JSON object (OpenAI ``response_format: {"type": "json_object"}``)."""
    return _llama_grammar().JSON_GBNF


@lru_cache(maxsize=1)
def _llama_grammar() -> Any:
    """llama-cpp-python's ``llama_grammar`` module, loaded from its file without importing ``llama_cpp``
    (whose ``__init__`` loads the shared library)."""
    spec = importlib.util.find_spec("llama_cpp")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("llama-cpp-python is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "llama_grammar.py"
    mod_spec = importlib.util.spec_from_file_location("hearth_llama_grammar", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def add_grammar_checked(sampler: Any, model: Any, gbnf: str, root: str = "root") -> None:
    """Append a grammar sampler to ``sampler`` (a llama-cpp-python ``LlamaSampler``); raises
    ``InvalidRequest(param="grammar")`` if llama.cpp cannot parse ``gbnf``."""
    import llama_cpp

    ptr = llama_cpp.llama_sampler_init_grammar(model.vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
    if not ptr:
        raise InvalidRequest("the grammar could not be parsed by llama.cpp", param="grammar")
    llama_cpp.llama_sampler_chain_add(sampler.sampler, ptr)
