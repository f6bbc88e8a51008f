"""The answer's reserve and exact prompt counts, shared by the turn (``app.assistant.turn``) and the stateless
grounding of port requests (``app.assistant.grounding``), so that neither imports the other.
"""

from __future__ import annotations

from app.protocol.backend import Backend
from app.protocol.tools import ToolSpec
from app.protocol.types import ChatMessage, GenerateRequest

DEFAULT_MAX_TOKENS = 256  # tokens reserved for an answer when the decoding settings give none


def prompt_tokens(engine: Backend, messages: list[ChatMessage] | tuple[ChatMessage, ...],
                  tools: tuple[ToolSpec, ...] = ()) -> int:
    """Exact prompt tokens of ``messages`` (and the definitions of ``tools``) once ``engine``'s chat template
    is applied (BOS included)."""
    rp = engine.render(GenerateRequest(messages=tuple(messages), tools=tuple(tools)))
    return len(engine.tokenize(rp.text, add_bos=rp.add_bos, special=True))
