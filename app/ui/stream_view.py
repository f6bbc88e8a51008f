"""The answer as it streams, drawn into the chat's rows: answer and thinking text onto the streaming bubble,
tool calls and their results as rows of their own, the passages given to the model.

Connected by the window to the turn's signals (``app.ui.chat_ctl``); it keeps no state but the rows.
"""

from __future__ import annotations

from typing import Any

from app.ui.chat_view import ChatView
from app.ui.models import ChatModel, ChatRow


class StreamView:
    """Writes a streaming turn into ``chat_model`` (shown by ``chat``)."""

    def __init__(self, chat_model: ChatModel, chat: ChatView) -> None:
        self.chat_model, self.chat = chat_model, chat

    def streaming_bubble(self) -> None:
        last = self.chat_model.item(self.chat_model.rowCount() - 1)
        if last is None or last.role != "assistant" or not last.streaming:
            self.chat_model.append(ChatRow(None, "assistant", "", streaming=True))

    def delta(self, text: str) -> None:
        """Answer text: onto the streaming bubble, or a new one after a tool call; thinking has ended."""
        self.streaming_bubble()
        self.chat_model.append_text(text)
        self.chat.set_thinking(False)

    def reasoning(self, text: str) -> None:
        """Thinking text: into the streaming bubble's collapsed thinking; Stop thinking shows until the
        answer begins."""
        self.streaming_bubble()
        self.chat_model.append_reasoning(text)
        last = self.chat_model.item(self.chat_model.rowCount() - 1)
        self.chat.set_thinking(last is not None and last.thinking)

    def tool_call(self, req: Any) -> None:
        """``req``: the turn's ``ToolCallRequested``: the answer so far stops, a tool row appears."""
        last = self.chat_model.item(self.chat_model.rowCount() - 1)
        if last is not None and last.role == "assistant" and last.streaming:
            self.chat_model.update_last(streaming=False, tool_calls=(req.call,))
        if self.chat_model.row_of_call(req.call.id) >= 0:
            return
        self.chat_model.append(ChatRow(None, "tool", "", call_id=req.call.id, tool_name=req.call.name,
                                       server=req.server, tool=req.tool, arguments=req.call.arguments,
                                       tool_state="asking" if req.needs_permission else "running"))

    def tool_result(self, shown: Any) -> None:
        """``shown``: the turn's ``ToolResultShown``."""
        i = self.chat_model.row_of_call(shown.call.id)
        if i >= 0:
            self.chat_model.update_row(i, id=shown.message_id, content=shown.text, tool_state=shown.outcome,
                                       notice=shown.notice, size_bytes=shown.size_bytes,
                                       prompt_note=shown.prompt_note)

    def evidence(self, evidence: list) -> None:
        self.chat_model.update_last(retrieved=list(evidence))
