"""``response_format`` → a GBNF grammar, refusing anything that could hang, fetch or crash.

A JSON schema goes through five gates before a grammar reaches llama.cpp (the gates live in
``app.engine.structured.schema_check``, shared with tool schemas):

The reasoning: docs/server.md, 'app/server/structured.py'.
"""

from __future__ import annotations

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
)
from app.engine.structured.schema_check import grammar_nesting as _nesting
from app.errors import InvalidRequest
from app.server.openai_schema import ResponseFormat

# The gates' names stay importable from here, where they were first defined.
__all__ = ["grammar_for", "check_schema", "unenforceable", "UNENFORCED", "ENFORCED_FORMATS", "MAX_SCHEMA_CHARS",
           "MAX_SCHEMA_DEPTH", "MAX_GRAMMAR_CHARS", "MAX_GRAMMAR_NESTING", "PARAM", "_nesting"]

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
        refuse_unenforceable(schema, PARAM)
    gbnf = schema_to_gbnf(schema)
    check_grammar(gbnf, PARAM)
    return gbnf
