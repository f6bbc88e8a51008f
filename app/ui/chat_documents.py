"""The documents of the chat shown: the Documents page's checks, the header's and panel's notes, files dropped
on the chat (attached to it while they are indexed, taken off again with the reason when they cannot be).

The window owns which chat is shown (``conversation_id()``); this keeps the rest.
"""

from __future__ import annotations

from typing import Any, Callable

from app.retrieval.types import STATUS_FAILED, STATUS_SKIPPED
from app.ui.formatting import documents_indicator, file_name


def unusable(report: Any, dropped: set[str]) -> list[Any]:
    """The ``FileStatus`` of each ``dropped`` path that the run ``report`` (``IngestReport``) did not index
    (failed, or skipped as not a document)."""
    return [f for f in report.files if f.path in dropped and f.status in (STATUS_FAILED, STATUS_SKIPPED)]


def unusable_text(files: list[Any]) -> str:
    """The chat's line for dropped files that were not attached: each name with its reason."""
    return "Not attached: " + "; ".join(f"{file_name(f.path)}: {f.reason or f.status}" for f in files)


class ChatDocuments:
    """``ctx``: the ``AppContext``; ``page``: the ``DocumentsPanel``; ``notes``: the header and the chat panel
    (each has ``set_documents(text, tip)``); ``conversation_id()``: the chat shown (None: a new one);
    ``say(text, error)``: a line under the chat ("" clears it)."""

    def __init__(self, ctx: Any, page: Any, notes: tuple[Any, ...], conversation_id: Callable[[], str | None],
                 say: Callable[[str, bool], None]) -> None:
        self.ctx, self.page, self.notes = ctx, page, notes
        self.conversation_id, self.say = conversation_id, say
        self.dropped: tuple[str | None, set[str]] | None = None  # (its chat, the files) while they are indexed
        page.selection_changed.connect(self.chosen)
        ctx.docs.report.connect(self.indexed)

    def chosen(self, paths: list[str] | None) -> None:
        """The chat's documents are now ``paths`` (None: every document; stored for a stored chat)."""
        cid = self.conversation_id()
        if cid is not None:
            self.ctx.set_conversation_documents(cid, paths)
        self.show(paths)

    def show(self, paths: list[str] | None) -> None:
        """The header's and the panel's notes for ``paths``."""
        note = documents_indicator(paths)
        for w in self.notes:
            w.set_documents(*note)

    def attach(self, paths: list[str]) -> None:
        """Files or folders dropped on the chat: their documents join this chat's (a new chat's: when it is
        created), ticked on the Documents page; other chats are not given them. The window indexes them; a file
        the run cannot use is taken off again (``indexed``)."""
        from app.retrieval.ingest import document_paths

        files = document_paths(paths)
        chosen = self.page.model.selected_paths()
        if chosen is None:  # a chat from before per-chat documents: it uses them all, the dropped ones too
            return
        self.dropped = (self.conversation_id(), set(files))
        merged = sorted(set(chosen) | set(files))
        self.page.show_selection(merged)
        self.chosen(merged)
        n = len(files)
        self.say(f"Indexing {n} dropped file{'s' if n != 1 else ''} for this chat (progress on the Documents page).",
                 False)

    def indexed(self, report: Any) -> None:
        """An indexing run ended: the dropped files it could not use leave their chat, named with the reason."""
        if self.dropped is None:
            return
        cid, files = self.dropped
        self.dropped = None
        self.say("", False)
        bad = unusable(report, files)
        if not bad:
            return
        gone = {f.path for f in bad}
        if cid is None or cid == self.conversation_id():
            keep = [p for p in self.page.model.selected_paths() or [] if p not in gone]
            self.page.show_selection(keep)
            self.chosen(keep)
        else:
            keep = [p for p in self.ctx.conversation_documents(cid) or [] if p not in gone]
            self.ctx.set_conversation_documents(cid, keep)
        self.say(unusable_text(bad), True)
