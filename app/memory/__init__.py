"""Conversations that are never lost: records and their content addresses (``records``), an append-only
message store over them (``store``), export and import (``transfer``), context assembly within a token budget
with summaries kept apart from what was said (``context``). The turn that uses them is ``app.assistant``.
No Qt and no engine imports here (see docs/memory.md).
"""

from __future__ import annotations

from app.memory.context import ContextBuilder, ContextPlan, Summarizer, SummaryRequest, summary_prompt
from app.memory.records import (
    Citation,
    Conversation,
    ConversationData,
    Message,
    Reasoning,
    SearchHit,
    Summary,
    message_id,
)
from app.memory.store import Store

__all__ = [
    "Citation", "ContextBuilder", "ContextPlan", "Conversation", "ConversationData", "Message", "Reasoning",
    "SearchHit", "Store", "Summarizer", "Summary", "SummaryRequest", "message_id", "summary_prompt",
]
