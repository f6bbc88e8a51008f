"""``response_format`` → a GBNF grammar, refusing anything that could hang, fetch or crash.

A JSON schema goes through five gates before a grammar reaches llama.cpp (the gates live in
``app.engine.structured.schema_check``, shared with tool schemas):

The reasoning: docs/server.md, 'app/server/structured.py'.
"""

from __future__ import annotations

import json
from typing import Optional, Sequence

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
from app.server.errors import AnswerMismatch
from app.server.openai_schema import ResponseFormat

# The gates' names stay importable from here, where they were first defined.
__all__ = ["grammar_for", "answer_problem", "checked_format", "check_answer", "check_cut",
           "check_schema", "unenforceable", "UNENFORCED", "ENFORCED_FORMATS",
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
        # The port checks every whole answer against what the grammar leaves out (``check_answer``, a 422), so
        # a strict schema takes those keywords, as strict tools do; only a ``format`` the grammar does not know
        # stays refused (the format checker does not assert every format).
        refuse_unenforceable(schema, PARAM)
    gbnf = schema_to_gbnf(schema, "response_format.json_schema.schema")
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


def checked_format(fmt: ResponseFormat | None) -> ResponseFormat | None:
    """``fmt`` when its answers need the check after generation: a ``json_schema`` with keywords the grammar
    does not enforce (``unenforceable``: a wide or ``number`` bound, ``multipleOf``, ``uniqueItems``...); None
    when the grammar enforces the whole schema, or for ``json_object`` / ``text`` / no format."""
    if fmt is None or fmt.type != "json_schema" or fmt.json_schema is None:
        return None
    schema = fmt.json_schema.schema_
    return fmt if isinstance(schema, dict) and unenforceable(schema) else None


def check_answer(text: str, finish_reason: str, fmt: ResponseFormat | None) -> None:
    """Raise ``AnswerMismatch`` (a 422 naming ``response_format`` and ``answer_problem``'s line: the place, the
    keyword, the value) when an answer written under ``fmt`` breaks its schema. An answer cut off by
    ``max_tokens`` (``finish_reason`` "length") is not checked: it goes back as it is, and its finish reason
    says why it is incomplete, as OpenAI answers it. No retry: greedy decoding would write the same answer."""
    if fmt is None or finish_reason == "length":
        return
    problem = answer_problem(text, fmt)
    if problem is not None:
        raise AnswerMismatch(problem, PARAM)


CUT_ADVICE = ("A stop sequence applies inside the JSON too, as OpenAI's does; remove it, or choose one the answer "
              "cannot contain")


def check_cut(text: str, finish_reason: str, matched: Optional[str], stops: Sequence[str]) -> None:
    """Raise ``AnswerMismatch`` (a 422 naming ``response_format``) when one of the request's own ``stops`` (the
    engine's ``matched``, ``Done.info["stop_sequence"]``) ended an answer decoded under a ``response_format``
    grammar before its JSON was complete. The template's stop strings do not apply under a grammar
    (``templates.render``), so only the client's can cut it; the answer would otherwise go back as invalid JSON
    with finish_reason "stop", which claims a whole answer. An answer that is whole JSON up to the stop passes."""
    if finish_reason != "stop" or matched is None or matched not in stops:
        return
    try:
        json.loads(text)
    except ValueError as exc:
        raise AnswerMismatch(f"the stop sequence {matched!r} ended it before its JSON was complete ({exc})", PARAM,
                             CUT_ADVICE) from None
