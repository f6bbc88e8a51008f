"""Constrained decoding with GBNF grammars, without ever letting a bad grammar crash the process.

llama-cpp-python 0.3.36's ``LlamaSampler.add_grammar`` adds whatever ``llama_sampler_init_grammar`` returns to
the sampler chain; for a grammar llama.cpp cannot parse that is NULL, and the chain then crashes
(docs/llama-cpp-notes.md). Here the pointer is checked first and a bad grammar becomes ``InvalidRequest``.
JSON schemas are turned into GBNF by llama-cpp-python's port of llama.cpp's ``json_schema_to_grammar``.
"""

from __future__ import annotations

import json
from typing import Any

from app.errors import InvalidRequest


def schema_to_gbnf(schema: Any) -> str:
    """GBNF text for a JSON schema (dict). Raises ``InvalidRequest(param="response_format")`` when the schema
    is not an object or uses something the converter cannot compile."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    if not isinstance(schema, dict):
        raise InvalidRequest("response_format.json_schema.schema must be a JSON object",
                             param="response_format")
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # the converter raises bare Exceptions/KeyErrors/RecursionError
        raise InvalidRequest(f"cannot compile this JSON schema into a grammar: {type(exc).__name__}: {exc}",
                             param="response_format") from None


def json_object_gbnf() -> str:
    """GBNF for any JSON object (OpenAI ``response_format: {"type": "json_object"}``)."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


def add_grammar_checked(sampler: Any, model: Any, gbnf: str, root: str = "root") -> None:
    """Append a grammar sampler to ``sampler`` (a llama-cpp-python ``LlamaSampler``); raises
    ``InvalidRequest(param="grammar")`` if llama.cpp cannot parse ``gbnf``."""
    import llama_cpp

    ptr = llama_cpp.llama_sampler_init_grammar(model.vocab, gbnf.encode("utf-8"), root.encode("utf-8"))
    if not ptr:
        raise InvalidRequest("the grammar could not be parsed by llama.cpp", param="grammar")
    llama_cpp.llama_sampler_chain_add(sampler.sampler, ptr)
