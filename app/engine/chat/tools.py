"""Function calling, the values: tool definitions, ``tool_choice``, calls, and checking a call's arguments.

The shapes are OpenAI's; a tool list is checked once, when a request arrives, and each failure is an
``InvalidRequest`` naming the field's path. Nothing here imports llama.cpp or Qt.

The reasoning: docs/tools.md, 'app/engine/chat/tools.py'.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Sequence

from app.engine.structured import schema_check
from app.engine.structured.grammar import schema_to_gbnf
from app.errors import InvalidRequest
from app.protocol.tools import CHOICE_MODES, EMPTY_PARAMETERS, NAME_RE, ToolCall, ToolChoice, ToolSpec

MAX_TOOLS = 128  # OpenAI's limit on len(tools)
# All tools together, as GBNF (``required`` builds one grammar holding every tool; each alone is already
# capped at schema_check.MAX_GRAMMAR_CHARS).
MAX_TOOLS_GRAMMAR_CHARS = 1_000_000


def parse_tools(raw: Any) -> tuple[ToolSpec, ...]:
    """Check an OpenAI ``tools`` list and return its tools. ``None`` and ``[]`` are no tools.

    Raises ``InvalidRequest`` whose ``param`` names the field: ``tools`` (not a list, more than ``MAX_TOOLS``,
    grammars too large together), ``tools[i].type``, ``tools[i].function``, ``tools[i].function.name`` (missing,
    not ``^[a-zA-Z0-9_-]{1,64}$``, or a duplicate), ``tools[i].function.description``,
    ``tools[i].function.parameters`` (not an object schema, too large, invalid, not compilable, or with
    ``strict: true`` a keyword the grammar would ignore) and ``tools[i].function.strict``."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidRequest('tools must be an array of {"type": "function", "function": {...}} objects, '
                             f"got {type(raw).__name__}", param="tools")
    if len(raw) > MAX_TOOLS:
        raise InvalidRequest(f"tools holds {len(raw)} tools; at most {MAX_TOOLS} are allowed", param="tools")
    specs: list[ToolSpec] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw):
        spec = _parse_tool(item, f"tools[{i}]")
        if spec.name in seen:
            raise InvalidRequest(f"tools[{i}].function.name {spec.name!r} is also the name of "
                                 f"tools[{seen[spec.name]}]; function names must be unique",
                                 param=f"tools[{i}].function.name")
        seen[spec.name] = i
        specs.append(spec)
    return tuple(specs)


def forced_tools(tools: Sequence[ToolSpec], choice: ToolChoice) -> list[ToolSpec]:
    """The tools a forced ``choice`` decodes through: every tool for "required", the named one for a function.
    Raises ``InvalidRequest(param="tool_choice")`` when there is none."""
    if choice.mode == "required":
        if not tools:
            raise InvalidRequest("tool_choice is 'required' but the request has no tools", param="tool_choice")
        return list(tools)
    chosen = [t for t in tools if t.name == choice.name]
    if not chosen:
        raise InvalidRequest(f"tool_choice names function {choice.name!r}, which is not in tools",
                             param="tool_choice")
    return chosen


def check_tool_grammars(tools: Sequence[ToolSpec], choice: ToolChoice) -> None:
    """Compile the grammars a forced ``choice`` decodes through (``required``: every tool; a named function:
    that one), so a schema the converter cannot compile, or one whose grammar would be too large, is a 400
    before the request is queued. ``auto`` and ``none`` decode without a grammar: nothing is built (a schema
    with ``maxLength: 1000`` is fine there). Raises ``InvalidRequest`` naming ``tools[i].function.parameters``,
    or ``tools`` when the grammars are too large together."""
    if not choice.forces_call:
        return
    chosen = {spec.name for spec in forced_tools(tools, choice)}
    total = 0
    for i, spec in enumerate(tools):
        if spec.name not in chosen:
            continue
        at = f"tools[{i}].function.parameters"
        try:
            gbnf = parameters_gbnf(spec.parameters)
        except InvalidRequest as exc:  # schema_to_gbnf names response_format
            raise InvalidRequest(exc.message, param=at) from None
        schema_check.check_grammar(gbnf, at)
        total += len(gbnf)
    if total > MAX_TOOLS_GRAMMAR_CHARS:
        raise InvalidRequest(f"the tools' schemas compile to {total} characters of grammar together; at most "
                             f"{MAX_TOOLS_GRAMMAR_CHARS} are allowed (send fewer or smaller tools)", param="tools")


def _parse_tool(item: Any, at: str) -> ToolSpec:
    if not isinstance(item, dict):
        raise InvalidRequest(f"{at} must be an object, got {type(item).__name__}", param=at)
    if item.get("type") != "function":
        raise InvalidRequest(f"{at}.type must be 'function' (the only tool type supported), got {item.get('type')!r}",
                             param=f"{at}.type")
    fn = item.get("function")
    if not isinstance(fn, dict):
        raise InvalidRequest(f"{at}.function must be an object with a name", param=f"{at}.function")
    at = f"{at}.function"
    name = fn.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidRequest(f"{at}.name must be 1-64 letters, digits, '_' or '-', got {name!r}", param=f"{at}.name")
    description = fn.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise InvalidRequest(f"{at}.description must be a string", param=f"{at}.description")
    strict = fn.get("strict", False)
    if strict is None:
        strict = False
    if not isinstance(strict, bool):
        raise InvalidRequest(f"{at}.strict must be true or false, got {strict!r}", param=f"{at}.strict")
    parameters = _check_parameters(fn.get("parameters"), f"{at}.parameters", strict)
    return ToolSpec(name, description, parameters, strict)


def _check_parameters(schema: Any, at: str, strict: bool) -> dict[str, Any]:
    """The tool's schema, checked; an absent or empty one is ``EMPTY_PARAMETERS`` (OpenAI: omitting
    ``parameters`` defines a function with an empty parameter list)."""
    if schema is None or schema == {}:
        return EMPTY_PARAMETERS
    schema_check.check_schema(schema, param=at, where=at)
    if schema.get("type") != "object":
        raise InvalidRequest(f"{at} must be a JSON schema of type 'object', got type {schema.get('type')!r}",
                             param=at)
    if strict:
        schema_check.refuse_unenforceable(schema, at, label="strict function")
    return schema


def parameters_gbnf(parameters: dict[str, Any]) -> str:
    """GBNF (llama.cpp syntax, ``root ::=`` the arguments object) for a tool's ``parameters`` schema, cached by
    the schema's JSON text (keys unsorted: the order of ``properties`` is the order the grammar asks for).
    Raises ``InvalidRequest`` if the converter cannot compile the schema."""
    return _gbnf_for(json.dumps(parameters))


@lru_cache(maxsize=512)
def _gbnf_for(schema_json: str) -> str:
    return schema_to_gbnf(json.loads(schema_json))


def parse_tool_choice(raw: Any, tools: Sequence[ToolSpec]) -> ToolChoice:
    """Check OpenAI ``tool_choice`` against the request's tools. ``None`` is "auto" when there are tools and
    "none" when there are none (OpenAI's defaults). Accepts "auto", "none", "required" and
    ``{"type": "function", "function": {"name": ...}}``.

    Raises ``InvalidRequest(param="tool_choice")`` for anything else, for "required" or a function without
    tools, and for a function name that is not in ``tools``."""
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(raw, str):
        if raw not in CHOICE_MODES:
            raise InvalidRequest(f"tool_choice must be one of {', '.join(CHOICE_MODES)} or "
                                 f'{{"type": "function", "function": {{"name": ...}}}}, got {raw!r}',
                                 param="tool_choice")
        if raw == "required" and not tools:
            raise InvalidRequest("tool_choice is 'required' but the request has no tools", param="tool_choice")
        return ToolChoice(raw)
    fn = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise InvalidRequest('tool_choice must be "auto", "none", "required" or '
                             '{"type": "function", "function": {"name": ...}}', param="tool_choice")
    names = [t.name for t in tools]
    if name not in names:
        raise InvalidRequest(f"tool_choice names function {name!r}, which is not in tools (available: "
                             f"{', '.join(names) if names else 'none'})", param="tool_choice")
    return ToolChoice("function", name)


def validate_call(call: ToolCall, tools: Sequence[ToolSpec]) -> str | None:
    """What is wrong with ``call`` for these tools, as one line for a person, or None when it is valid: an
    unknown tool, arguments that are not JSON text of an object, or arguments that break the tool's schema
    (the first error ``jsonschema`` finds, with its path, e.g. "arguments.city: 3 is not of type 'string'")."""
    tool = next((t for t in tools if t.name == call.name), None)
    if tool is None:
        names = ", ".join(t.name for t in tools) or "none"
        return f"the model called {call.name!r}, which is not one of the tools ({names})"
    try:
        args = json.loads(call.arguments)
    except ValueError as exc:
        return f"the arguments of {call.name!r} are not valid JSON: {exc}"
    if not isinstance(args, dict):
        return f"the arguments of {call.name!r} must be a JSON object, got {type(args).__name__}"
    import jsonschema

    validator = jsonschema.validators.validator_for(tool.parameters)(tool.parameters)
    error = jsonschema.exceptions.best_match(validator.iter_errors(args))
    if error is None:
        return None
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return f"the arguments of {call.name!r} do not match its schema: arguments{where}: {error.message}"
