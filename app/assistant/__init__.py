"""The turn pipeline: one chat turn (evidence → context → generation → tools → store → citations) written once,
for the CLI, the desktop window and the HTTP port (``turn.Assistant``), MCP tools called in a bounded loop
(``tool_loop.ToolBox``), stateless grounding for requests that carry their own history (``grounding.ground``),
and the evidence/citation conversions they share (``evidence``)."""

from app.assistant.evidence import DocumentSource, Found, attributions, citations, given, prune_stale_citations
from app.assistant.grounding import Grounding, ground
from app.assistant.tool_loop import (
    Permission,
    ToolBox,
    ToolCallRequested,
    ToolNotice,
    ToolResultShown,
    deny_all,
)
from app.assistant.turn import Assistant, Caller, EvidenceFound, ReasoningDelta, TextDelta, TurnDone, TurnEvent

__all__ = ["Assistant", "Caller", "DocumentSource", "EvidenceFound", "Found", "Grounding", "Permission",
           "ReasoningDelta", "TextDelta", "ToolBox", "ToolCallRequested", "ToolNotice", "ToolResultShown", "TurnDone",
           "TurnEvent", "attributions", "citations", "deny_all", "given", "ground", "prune_stale_citations"]
