"""Function calling, the values: tool definitions (``ToolSpec``), ``tool_choice`` (``ToolChoice``) and calls
(``ToolCall``), in the shapes of the OpenAI chat completions API reference. Checking a request's tools and
building their grammars is ``app.engine.chat.tools``.
"""

from __future__ import annotations

import re
import secrets
import string
from dataclasses import dataclass
from typing import Any

NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI: ^[a-zA-Z0-9_-]{1,64}$
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
CHOICE_MODES = ("auto", "none", "required")
_ID_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call. ``name`` matches ``NAME_RE``; ``description`` may be "";
    ``parameters`` is a JSON schema of an object (``EMPTY_PARAMETERS`` when the request left it out);
    ``strict``: the request's ``function.strict`` (the schema was checked to be fully enforceable)."""

    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool = False

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` item (what a GGUF's Jinja template expects in its ``tools`` variable)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolChoice:
    """``tool_choice``: ``mode`` is "auto" (the model decides), "none" (no call), "required" (at least one call
    of any tool) or "function" (a call of ``name``)."""

    mode: str
    name: str | None = None

    @property
    def forces_call(self) -> bool:
        """True for "required" and a named function: decoding goes through a grammar that allows only calls."""
        return self.mode in ("required", "function")


@dataclass(frozen=True)
class ToolCall:
    """A call the model made. ``id``: "call_" + 24 letters/digits (``new_call_id``); ``arguments``: JSON text
    of an object, as the model wrote it (OpenAI's ``function.arguments``)."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI ``message.tool_calls`` item."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    """A fresh call id: "call_" and 24 random ASCII letters and digits (the shape OpenAI's ids have)."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))
