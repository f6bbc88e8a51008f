"""Gates a JSON schema passes before it becomes a grammar: shared by ``response_format`` and ``tools``.

``check_schema`` (limits, no outside ``$ref``, the meta-schema), ``unenforceable`` (what the converter would
ignore, refused under ``strict: true``) and ``check_grammar`` (the grammar's length and nesting); each raises
``InvalidRequest`` with the ``param`` the caller names.

The reasoning: docs/tools.md, 'app/engine/structured/schema_check.py'.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from app.engine.structured.grammar import RANGE_KEYS, int_range
from app.errors import InvalidRequest

MAX_SCHEMA_CHARS = 64_000
MAX_SCHEMA_DEPTH = 32
MAX_GRAMMAR_CHARS = 200_000
MAX_GRAMMAR_NESTING = 256

# Keywords llama-cpp-python's schema converter (0.3.36) does not turn into grammar rules: an answer could
# break them.
UNENFORCED = frozenset({
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "not", "if", "then", "else",
    "uniqueItems", "contains", "minContains", "maxContains", "minProperties", "maxProperties",
    "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies",
    "unevaluatedProperties", "unevaluatedItems"})
# What a caller that validates every answer after generation with ``jsonschema`` (tool calls:
# ``app.engine.chat.tools.validate_call``) still catches: all of the above. ``format`` is not among them:
# jsonschema only asserts it with a format checker.
CHECKED_AFTER = UNENFORCED
ENFORCED_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})


def check_schema(schema: Any, param: str = "response_format",
                 where: str = "response_format.json_schema.schema") -> None:
    """Raise ``InvalidRequest(param=param)`` unless ``schema`` is a small, self-contained, valid JSON schema.
    ``where`` names the schema in the message ("… must be a JSON object")."""
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{where} must be a JSON object", param=param)
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        raise InvalidRequest(f"the JSON schema is larger than {MAX_SCHEMA_CHARS} characters", param=param)
    _walk(schema, 0, param)
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidRequest(f"invalid JSON schema: {exc.message}", param=param) from None


def unenforceable(schema: Any, path: str = "schema", checked_after: frozenset[str] = frozenset()) -> list[str]:
    """``"'maximum' at schema.properties.age"``… for each keyword in ``schema`` the grammar would ignore,
    leaving out those in ``checked_after`` and the bounds of a small integer range (``grammar.int_range``: the
    grammar lists its values)."""
    if not isinstance(schema, dict):
        return []
    ignored = UNENFORCED - checked_after
    if int_range(schema) is not None:
        ignored -= RANGE_KEYS
    out = [f"{k!r} at {path}" for k in sorted(ignored & set(schema))]
    fmt = schema.get("format")
    if fmt is not None and fmt not in ENFORCED_FORMATS:
        out.append(f"format {fmt!r} at {path}")
    for key in ("properties", "$defs", "definitions"):
        for name, sub in (schema.get(key) or {}).items() if isinstance(schema.get(key), dict) else ():
            out += unenforceable(sub, f"{path}.{key}.{name}", checked_after)
    for key in ("items", "additionalProperties"):
        out += unenforceable(schema.get(key), f"{path}.{key}", checked_after)
    for key in ("prefixItems", "anyOf", "oneOf", "allOf"):
        subs = schema.get(key)
        for i, sub in enumerate(subs if isinstance(subs, list) else ()):
            out += unenforceable(sub, f"{path}.{key}[{i}]", checked_after)
    if isinstance(schema.get("items"), list):
        for i, sub in enumerate(schema["items"]):
            out += unenforceable(sub, f"{path}.items[{i}]", checked_after)
    return out


def refuse_unenforceable(schema: Any, param: str, label: str = "strict json_schema",
                         checked_after: frozenset[str] = CHECKED_AFTER) -> None:
    """The ``strict: true`` gate: raise ``InvalidRequest(param=param)`` naming up to five keywords of
    ``schema`` that neither the grammar enforces nor the caller checks after generation (``checked_after``;
    the default is a caller that validates every answer, as tool calls are); ``label`` opens the message."""
    ignored = unenforceable(schema, checked_after=checked_after)
    if ignored:
        raise InvalidRequest(f"{label}: the grammar cannot enforce " + ", ".join(ignored[:5])
                             + "; remove these keywords or set strict to false", param=param)


def value_problem(value: Any, schema: dict[str, Any], where: str = "answer") -> str | None:
    """What is wrong with ``value`` (parsed JSON) under ``schema``, checked by ``jsonschema`` (formats
    included), as one line naming the place, the keyword and the value: ``"answer.score: 7 is greater than
    the maximum of 5 (keyword 'maximum', value 7)"``; None when it is valid. ``where`` names the root."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    error = jsonschema.exceptions.best_match(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(value))
    if error is None:
        return None
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    shown = json.dumps(error.instance, ensure_ascii=False)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return f"{where}{path}: {error.message} (keyword {error.validator!r}, value {shown})"


def check_grammar(gbnf: str, param: str) -> None:
    """Raise ``InvalidRequest(param=param)`` if ``gbnf`` is longer than ``MAX_GRAMMAR_CHARS`` or nests
    parentheses deeper than ``MAX_GRAMMAR_NESTING``."""
    if len(gbnf) > MAX_GRAMMAR_CHARS or grammar_nesting(gbnf) > MAX_GRAMMAR_NESTING:
        raise InvalidRequest("this JSON schema compiles to a grammar too large to enforce (lower maxLength, "
                             "maxItems or similar bounds)", param=param)


def gbnf_code(gbnf: str) -> Iterator[tuple[int, str]]:
    """``(index, character)`` of every character of GBNF text outside string literals and character classes
    (an escaped character inside them is skipped with its backslash)."""
    i, n = 0, len(gbnf)
    while i < n:
        c = gbnf[i]
        if c in "\"[":
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and gbnf[i] != close:
                i += 2 if gbnf[i] == "\\" else 1
        else:
            yield i, c
        i += 1


def grammar_nesting(gbnf: str) -> int:
    """Deepest parenthesis nesting in GBNF text, skipping string literals and character classes."""
    depth = deepest = 0
    for _, c in gbnf_code(gbnf):
        if c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
    return deepest


def _walk(node: Any, depth: int, param: str) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise InvalidRequest(f"the JSON schema is nested deeper than {MAX_SCHEMA_DEPTH} levels", param=param)
    if isinstance(node, dict):
        ref = node.get("$ref")
        if ref is not None and (not isinstance(ref, str) or not ref.startswith("#")):
            raise InvalidRequest(f"only local $ref (starting with '#') are supported, got {ref!r}", param=param)
        for v in node.values():
            _walk(v, depth + 1, param)
    elif isinstance(node, list):
        for v in node:
            _walk(v, depth + 1, param)
