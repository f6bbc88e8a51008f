"""Conversations that are never lost: an append-only, content-addressed message store (``store``), context
assembly within a token budget with summaries kept apart from what was said (``context``) and one chat turn
run end to end against an injected generator (``chat_session``). No Qt and no engine imports here: the engine
is passed in as callables (see docs/memory.md).
"""

from __future__ import annotations

from app.memory.context import ContextBuilder, ContextPlan, SummaryRequest, Summarizer, summary_prompt
from app.memory.store import (
    Citation,
    Conversation,
    ConversationData,
    Message,
    SearchHit,
    Store,
    Summary,
    message_id,
)

__all__ = [
    "Citation", "ContextBuilder", "ContextPlan", "Conversation", "ConversationData", "Message", "SearchHit",
    "Store", "Summarizer", "Summary", "SummaryRequest", "message_id", "summary_prompt",
]
