"""``response_format`` → a GBNF grammar, refusing anything that could hang, fetch or crash.

A JSON schema goes through five gates before a grammar reaches llama.cpp:

1. size and nesting limits on the schema itself, and no ``$ref`` outside the document (llama-cpp-python's
   converter would fetch an ``https://`` reference from the network);
2. ``jsonschema``'s meta-schema check (a schema that is not a schema is a 400, not a converter crash);
3. ``app.engine.grammar.schema_to_gbnf`` (a schema it cannot compile is a 400);
4. with ``strict: true``, no keyword the converter would silently ignore (``minimum``, ``uniqueItems``,
   ``format: email``…: ``UNENFORCED``): a strict answer validates against the whole schema;
5. limits on the grammar: its length and its parenthesis nesting. The converter writes ``maxLength: 5000``
   as 5000 nested groups, and llama.cpp parses grammars by recursion; a deep one could overflow the engine
   process's stack. (The engine process would restart, but a request must not be able to do that.)

llama.cpp's own parse check (``add_grammar_checked``) then runs in the engine process.
"""

from __future__ import annotations

import json
from typing import Any

from app.errors import InvalidRequest
from app.server.openai_schema import ResponseFormat

MAX_SCHEMA_CHARS = 64_000
MAX_SCHEMA_DEPTH = 32
MAX_GRAMMAR_CHARS = 200_000
MAX_GRAMMAR_NESTING = 256
PARAM = "response_format"


def grammar_for(fmt: ResponseFormat | None) -> str | None:
    """GBNF text for ``response_format`` (None for absent / ``text``). Raises ``InvalidRequest``."""
    if fmt is None or fmt.type == "text":
        return None
    from app.engine.grammar import json_object_gbnf, schema_to_gbnf

    if fmt.type == "json_object":
        return json_object_gbnf()
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise InvalidRequest("response_format.json_schema.schema is required for type json_schema",
                             param="response_format.json_schema")
    schema = fmt.json_schema.schema_
    check_schema(schema)
    if fmt.json_schema.strict:
        ignored = unenforceable(schema)
        if ignored:
            raise InvalidRequest("strict json_schema: the grammar cannot enforce " + ", ".join(ignored[:5])
                                 + "; remove these keywords or set strict to false", param=PARAM)
    gbnf = schema_to_gbnf(schema)
    if len(gbnf) > MAX_GRAMMAR_CHARS or _nesting(gbnf) > MAX_GRAMMAR_NESTING:
        raise InvalidRequest("this JSON schema compiles to a grammar too large to enforce (lower maxLength, "
                             "maxItems or similar bounds)", param=PARAM)
    return gbnf


def check_schema(schema: Any) -> None:
    """Raise ``InvalidRequest(param="response_format")`` unless ``schema`` is a small, self-contained,
    valid JSON schema."""
    if not isinstance(schema, dict):
        raise InvalidRequest("response_format.json_schema.schema must be a JSON object", param=PARAM)
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        raise InvalidRequest(f"the JSON schema is larger than {MAX_SCHEMA_CHARS} characters", param=PARAM)
    _walk(schema, 0)
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidRequest(f"invalid JSON schema: {exc.message}", param=PARAM) from None


# Keywords llama-cpp-python's schema converter (0.3.36) does not turn into grammar rules: an answer could
# break them. ``strict: true`` refuses them (as OpenAI's strict mode refuses what it cannot enforce).
UNENFORCED = frozenset({
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "not", "if", "then", "else",
    "uniqueItems", "contains", "minContains", "maxContains", "minProperties", "maxProperties",
    "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies",
    "unevaluatedProperties", "unevaluatedItems"})
ENFORCED_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})


def unenforceable(schema: Any, path: str = "schema") -> list[str]:
    """``"maximum at schema.properties.age"``… for each keyword in ``schema`` the grammar would ignore."""
    if not isinstance(schema, dict):
        return []
    out = [f"{k!r} at {path}" for k in sorted(UNENFORCED & set(schema))]
    fmt = schema.get("format")
    if fmt is not None and fmt not in ENFORCED_FORMATS:
        out.append(f"format {fmt!r} at {path}")
    for key in ("properties", "$defs", "definitions"):
        for name, sub in (schema.get(key) or {}).items() if isinstance(schema.get(key), dict) else ():
            out += unenforceable(sub, f"{path}.{key}.{name}")
    for key in ("items", "additionalProperties"):
        out += unenforceable(schema.get(key), f"{path}.{key}")
    for key in ("prefixItems", "anyOf", "oneOf", "allOf"):
        subs = schema.get(key)
        for i, sub in enumerate(subs if isinstance(subs, list) else ()):
            out += unenforceable(sub, f"{path}.{key}[{i}]")
    if isinstance(schema.get("items"), list):
        for i, sub in enumerate(schema["items"]):
            out += unenforceable(sub, f"{path}.items[{i}]")
    return out


def _walk(node: Any, depth: int) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise InvalidRequest(f"the JSON schema is nested deeper than {MAX_SCHEMA_DEPTH} levels", param=PARAM)
    if isinstance(node, dict):
        ref = node.get("$ref")
        if ref is not None and (not isinstance(ref, str) or not ref.startswith("#")):
            raise InvalidRequest(f"only local $ref (starting with '#') are supported, got {ref!r}", param=PARAM)
        for v in node.values():
            _walk(v, depth + 1)
    elif isinstance(node, list):
        for v in node:
            _walk(v, depth + 1)


def _nesting(gbnf: str) -> int:
    """Deepest parenthesis nesting in GBNF text, skipping string literals and character classes."""
    depth = deepest = 0
    i, n = 0, len(gbnf)
    while i < n:
        c = gbnf[i]
        if c in "\"[":
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and gbnf[i] != close:
                i += 2 if gbnf[i] == "\\" else 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
        i += 1
    return deepest
