"""``response_format`` → a GBNF grammar, refusing anything that could hang, fetch or crash.

A JSON schema goes through five gates before a grammar reaches llama.cpp (the gates live in
``app.engine.structured.schema_check``, shared with tool schemas):

The reasoning: docs/server.md, 'app/server/structured.py'.
"""

from __future__ import annotations

import json

from app.engine.structured.schema_check import (
    ENFORCED_FORMATS,
    MAX_GRAMMAR_CHARS,
    MAX_GRAMMAR_NESTING,
    MAX_SCHEMA_CHARS,
    MAX_SCHEMA_DEPTH,
    UNENFORCED,
    check_grammar,
    check_schema,
    refuse_unenforceable,
    unenforceable,
    value_problem,
)
from app.engine.structured.schema_check import grammar_nesting as _nesting
from app.errors import InvalidRequest
from app.server.openai_schema import ResponseFormat

# The gates' names stay importable from here, where they were first defined.
__all__ = ["grammar_for", "answer_problem", "check_schema", "unenforceable", "UNENFORCED", "ENFORCED_FORMATS",
           "MAX_SCHEMA_CHARS", "MAX_SCHEMA_DEPTH", "MAX_GRAMMAR_CHARS", "MAX_GRAMMAR_NESTING", "PARAM", "_nesting"]

PARAM = "response_format"


def grammar_for(fmt: ResponseFormat | None) -> str | None:
    """GBNF text for ``response_format`` (None for absent / ``text``). Raises ``InvalidRequest``."""
    if fmt is None or fmt.type == "text":
        return None
    from app.engine.structured.grammar import json_object_gbnf, schema_to_gbnf

    if fmt.type == "json_object":
        return json_object_gbnf()
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise InvalidRequest("response_format.json_schema.schema is required for type json_schema",
                             param="response_format.json_schema")
    schema = fmt.json_schema.schema_
    check_schema(schema)
    if fmt.json_schema.strict:
        # Nothing on the chat path checks an answer after generation yet (``answer_problem`` is that check):
        # a strict schema keeps only what the grammar enforces.
        refuse_unenforceable(schema, PARAM, checked_after=frozenset())
    gbnf = schema_to_gbnf(schema)
    check_grammar(gbnf, PARAM)
    return gbnf


def answer_problem(text: str, fmt: ResponseFormat | None) -> str | None:
    """What is wrong with an answer ``text`` written under ``fmt`` (``response_format``), as one line naming
    the place, the JSON-schema keyword and the value (``schema_check.value_problem``); or that it is not JSON
    (a ``json_object`` / ``json_schema`` answer cut off by ``max_tokens``). None when it is valid, and for
    ``text`` / no format. The check after generation for keywords the grammar does not enforce."""
    if fmt is None or fmt.type == "text":
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"the answer is not JSON: {exc}"
    if fmt.type == "json_object":
        return None if isinstance(value, dict) else f"the answer is a JSON {type(value).__name__}, not an object"
    schema = fmt.json_schema.schema_ if fmt.json_schema is not None else None
    return value_problem(value, schema) if isinstance(schema, dict) else None
