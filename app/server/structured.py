"""``response_format`` → a GBNF grammar, refusing anything that could hang, fetch or crash.

A JSON schema goes through five gates before a grammar reaches llama.cpp (the gates live in
``app.engine.structured.schema_check``, shared with tool schemas):

1. size and nesting limits on the schema itself, and no ``$ref`` outside the document (llama-cpp-python's
   converter would fetch an ``https://`` reference from the network);
2. ``jsonschema``'s meta-schema check (a schema that is not a schema is a 400, not a converter crash);
3. ``app.engine.structured.grammar.schema_to_gbnf`` (a schema it cannot compile is a 400);
4. with ``strict: true``, no keyword the converter would silently ignore (``minimum``, ``uniqueItems``,
   ``format: email``…: ``UNENFORCED``): a strict answer validates against the whole schema;
5. limits on the grammar: its length and its parenthesis nesting. The converter writes ``maxLength: 5000``
   as 5000 nested groups, and llama.cpp parses grammars by recursion; a deep one could overflow the engine
   process's stack. (The engine process would restart, but a request must not be able to do that.)

llama.cpp's own parse check (``add_grammar_checked``) then runs in the engine process.
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
