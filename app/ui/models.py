"""Item models (``QAbstractListModel``) behind the window's lists, testable without a window (vorta's
``test_archive_table_model.py`` habit). They hold plain values from the core (``Conversation``, ``SearchHit``,
``ModelEntry``, ``DocumentRow``/``FileStatus``, ``Message``) and never call the engine."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt, Signal

from app.ui.formatting import DATE_GROUPS, date_group, file_name, model_label

Index = QModelIndex | QPersistentModelIndex
ROOT = QModelIndex()

IdRole = Qt.ItemDataRole.UserRole + 1
KindRole = Qt.ItemDataRole.UserRole + 2
ItemRole = Qt.ItemDataRole.UserRole + 3
MessageIdRole = Qt.ItemDataRole.UserRole + 4
StatusRole = Qt.ItemDataRole.UserRole + 5
ProjectRole = Qt.ItemDataRole.UserRole + 6


class _ListModel(QAbstractListModel):
    """Rows of arbitrary Python objects; subclasses say how a row is shown."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._rows: list[Any] = []

    def rowCount(self, parent: Index = ROOT) -> int:  # noqa: N802 - Qt API
        return 0 if parent.isValid() else len(self._rows)

    def item(self, row: int) -> Any:
        return self._rows[row] if 0 <= row < len(self._rows) else None

    def items(self) -> list[Any]:
        return list(self._rows)

    def _reset(self, rows: list[Any]) -> None:
        self.beginResetModel()
        self._rows = rows
        self.endResetModel()


# ---------------------------------------------------------------------------------------------- sidebar
@dataclass(frozen=True)
class SidebarRow:
    """kind: "header" (a date group or "N results"), "project" (a project's header, selectable),
    "conversation" or "hit" (a search match)."""

    kind: str
    text: str
    conversation_id: str | None = None
    message_id: str | None = None
    tooltip: str = ""
    project_id: str | None = None  # a "project" header, or a conversation inside that project


class ConversationListModel(_ListModel):
    """Projects first (each a header with its conversations), then the other conversations grouped by date
    (Today, Yesterday, ...); or search hits while a search is shown."""

    def set_conversations(self, conversations: list[Any], today: date | None = None,
                          projects: list[Any] = ()) -> None:
        groups: dict[str, list[SidebarRow]] = {g: [] for g in DATE_GROUPS}
        known = {p.id for p in projects}
        members: dict[str, list[SidebarRow]] = {p.id: [] for p in projects}
        for c in conversations:  # most recently updated first (Store.list_conversations order)
            title = c.title or "New chat"
            settings = getattr(c, "settings", None)
            pid = settings.get("project") if isinstance(settings, dict) else None
            row = SidebarRow("conversation", title, c.id, tooltip=f"{title}\n{c.message_count} messages",
                             project_id=pid if pid in known else None)
            if pid in known:
                members[pid].append(replace(row, text="    " + title))
            else:
                groups[date_group(c.updated, today)].append(row)
        rows: list[SidebarRow] = []
        for p in projects:
            n = len(members[p.id])
            rows.append(SidebarRow("project", f"▾ {p.name}", tooltip=f"Project {p.name}: {n} chats",
                                   project_id=p.id))
            rows.extend(members[p.id])
        for name, members in groups.items():
            if members:
                rows.append(SidebarRow("header", name))
                rows.extend(members)
        self._reset(rows)

    def set_hits(self, query: str, hits: list[Any]) -> None:
        rows = [SidebarRow("header", f"{len(hits)} result{'s' if len(hits) != 1 else ''} for “{query}”")]
        for h in hits:
            snippet = " ".join(h.snippet.split())
            title = h.conversation_title or "New chat"
            # the matching text first (hits in one chat all began with its title, cut before the match), then
            # where it is; the tooltip holds both whole
            rows.append(SidebarRow("hit", f"{snippet}\n   in {title}", h.conversation_id, h.message_id,
                                   tooltip=f"{title}\n{h.role}: {snippet}"))
        self._reset(rows)

    def row_of(self, conversation_id: str) -> int:
        for i, r in enumerate(self._rows):
            if r.kind == "conversation" and r.conversation_id == conversation_id:
                return i
        return -1

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        r = self.item(index.row())
        if r is None:
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return r.text
        if role == Qt.ItemDataRole.ToolTipRole:
            return r.tooltip or None
        if role == IdRole:
            return r.conversation_id
        if role == MessageIdRole:
            return r.message_id
        if role == KindRole:
            return r.kind
        if role == ProjectRole:
            return r.project_id
        return None

    def row_of_project(self, project_id: str) -> int:
        """The row of a project's header, or -1."""
        return next((i for i, r in enumerate(self._rows) if r.kind == "project" and r.project_id == project_id), -1)

    def flags(self, index: Index) -> Qt.ItemFlag:
        r = self.item(index.row())
        if r is None or r.kind == "header":
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable


# ---------------------------------------------------------------------------------------------- models
class ModelListModel(_ListModel):
    """``registry.ModelEntry`` rows; the loaded one is marked, and one being prepared for its load (a file not
    there when the list was read: the bundled model assembled on a first start) says so."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.loaded_path: str | None = None
        self.preparing_path: str | None = None

    def set_entries(self, entries: list[Any]) -> None:
        self._reset(list(entries))

    def set_loaded(self, path: str | None) -> None:
        self.loaded_path = path
        if self._rows:
            self.dataChanged.emit(self.index(0), self.index(len(self._rows) - 1))

    def set_preparing(self, path: str | None) -> None:
        """The model at ``path`` is being loaded (None: none is): a row of it listed as not installed reads
        "preparing…" until the list is read again with its file there."""
        self.preparing_path = path
        if self._rows:
            self.dataChanged.emit(self.index(0), self.index(len(self._rows) - 1))

    def _preparing(self, e: Any) -> bool:
        return not e.installed and self.preparing_path is not None and e.path == self.preparing_path

    def row_of_path(self, path: str) -> int:
        for i, e in enumerate(self._rows):
            if e.path == path:
                return i
        return -1

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        e = self.item(index.row())
        if e is None:
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            loaded = "● " if self.loaded_path and e.path == self.loaded_path else ""
            if str(e.path).startswith("remote:"):  # a remote engine (model_panel.list_models_job)
                return f"{loaded}{e.id}  (remote engine{' · ' + e.quantization if e.quantization else ''})"
            return f"{loaded}{model_label(e, self._preparing(e))}"
        if role == Qt.ItemDataRole.ToolTipRole:
            if self._preparing(e):
                return "Being prepared for its first use (assembled from the installed packages, no network)"
            return e.error or e.path
        if role == ItemRole:
            return e
        if role == IdRole:
            return e.id
        return None


# ---------------------------------------------------------------------------------------------- documents
@dataclass(frozen=True)
class DocRow:
    """A document: ``status`` indexed / failed / duplicate / indexing...; ``reason`` for a person."""

    path: str
    status: str
    reason: str | None = None
    chunks: int = 0
    pages: int | None = None


class DocumentListModel(_ListModel):
    """Documents of the index with their status, checkable: the checks are the current conversation's choice
    of documents (``selected`` None means "all documents")."""

    selection_changed = Signal()

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.selected: set[str] | None = None

    def set_documents(self, docs: list[DocRow]) -> None:
        self._reset(sorted(docs, key=lambda d: d.path.lower()))

    def update_status(self, row: DocRow) -> None:
        """Insert or update one document (a file just handled by an ingest run)."""
        for i, d in enumerate(self._rows):
            if d.path == row.path:
                if row.status == "removed":
                    self.beginRemoveRows(ROOT, i, i)
                    del self._rows[i]
                    self.endRemoveRows()
                else:
                    self._rows[i] = row
                    self.dataChanged.emit(self.index(i), self.index(i))
                return
        if row.status != "removed":
            self.beginInsertRows(ROOT, len(self._rows), len(self._rows))
            self._rows.append(row)
            self.endInsertRows()

    def set_selection(self, paths: list[str] | None) -> None:
        self.selected = None if paths is None else set(paths)
        if self._rows:
            self.dataChanged.emit(self.index(0), self.index(len(self._rows) - 1))

    def selected_paths(self) -> list[str] | None:
        return None if self.selected is None else sorted(self.selected)

    def row_of(self, path: str) -> int:
        return next((i for i, d in enumerate(self._rows) if d.path == path), -1)

    def _checked(self, d: DocRow) -> bool:
        return self.selected is None or d.path in self.selected

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        d = self.item(index.row())
        if d is None:
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            name = file_name(d.path)
            detail = f"{d.chunks} passages" if d.status == "indexed" else (d.reason or "")
            return f"{name} — {d.status}" + (f" ({detail})" if detail else "")
        if role == Qt.ItemDataRole.ToolTipRole:
            return d.path + (f"\n{d.reason}" if d.reason else "")
        if role == Qt.ItemDataRole.CheckStateRole and d.status == "indexed":
            return Qt.CheckState.Checked if self._checked(d) else Qt.CheckState.Unchecked
        if role == StatusRole:
            return d.status
        if role == IdRole:
            return d.path
        return None

    def setData(self, index: Index, value: Any, role: int = Qt.ItemDataRole.EditRole) -> bool:  # noqa: N802
        d = self.item(index.row())
        if d is None or role != Qt.ItemDataRole.CheckStateRole:
            return False
        if self.selected is None:
            self.selected = {r.path for r in self._rows if r.status == "indexed"}
        on = value in (Qt.CheckState.Checked, Qt.CheckState.Checked.value, 2, True)
        (self.selected.add if on else self.selected.discard)(d.path)
        self.dataChanged.emit(index, index)
        self.selection_changed.emit()
        return True

    def flags(self, index: Index) -> Qt.ItemFlag:
        d = self.item(index.row())
        base = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        return base | Qt.ItemFlag.ItemIsUserCheckable if d is not None and d.status == "indexed" else base


# ---------------------------------------------------------------------------------------------- chat
@dataclass
class ChatRow:
    """One message on the shown branch. ``siblings``: (1-based position, count) among its parent's replies;
    ``citations``: dicts with evidence_id, path, page, quote and the citation check when it ran
    (``supported`` bool, ``sentence_start`` / ``sentence_end``: the citing sentence's str indices in
    ``content``, ``support``: ``{missing, similarity, threshold, reason}``; absent: not checked);
    ``retrieved``: passages given to the model (shown when the answer cited none); ``attributions``: each claim
    sentence of an answer that had evidence tied to a passage (or none) with its facts checked, cited or not
    (``Store.attributions_for`` dicts: ``sentence_start`` / ``sentence_end``, ``supported``, ``support``).

    Tool use: an assistant row's ``tool_calls`` are the calls it made; a ``tool`` row is one call and its
    result (``content``): ``call_id``, ``tool_name`` (the name the model used), ``server`` / ``tool`` (MCP
    names), ``arguments`` (JSON text), ``tool_state`` (asking, running, ok, error, denied, failed),
    ``notice`` (for the person), ``size_bytes`` of the result, ``prompt_note`` (the cut note when the prompt
    shows only part of it).

    Thinking: ``reasoning`` is the answer's thinking (stored apart; shown collapsed above the answer);
    ``reasoning_tokens`` its tokens (while it streams: the pieces so far, one per sampled token);
    ``reasoning_note`` why it ended when Hearth ended it ("budget reached", "stopped by you", ...);
    ``thinking``: thinking is streaming now (no answer text yet). ``agreement``: for an answer chosen by
    self-consistency, how many samples agreed (shown under it)."""

    id: str | None
    role: str
    content: str
    status: str = "complete"
    reasoning: str = ""
    parent_id: str | None = None
    siblings: tuple[int, int] = (1, 1)
    sibling_ids: tuple[str, ...] = ()
    citations: list[dict] = field(default_factory=list)
    retrieved: list[dict] = field(default_factory=list)
    attributions: list[dict] = field(default_factory=list)
    streaming: bool = False
    tool_calls: tuple = ()
    call_id: str | None = None
    tool_name: str = ""
    server: str = ""
    tool: str = ""
    arguments: str = ""
    tool_state: str = ""
    notice: str | None = None
    size_bytes: int = 0
    prompt_note: str | None = None
    reasoning_tokens: int | None = None
    reasoning_note: str = ""
    thinking: bool = False
    agreement: str = ""


class ChatModel(_ListModel):
    """The messages of the branch being shown; the last row grows while an answer streams."""

    def set_rows(self, rows: list[ChatRow]) -> None:
        self._reset(list(rows))

    def append(self, row: ChatRow) -> int:
        n = len(self._rows)
        self.beginInsertRows(ROOT, n, n)
        self._rows.append(row)
        self.endInsertRows()
        return n

    def update_last(self, **changes: Any) -> None:
        if self._rows:
            self.update_row(len(self._rows) - 1, **changes)

    def update_row(self, row: int, **changes: Any) -> None:
        """Change fields of row ``row`` (a ``dataChanged`` for it)."""
        self._rows[row] = replace(self._rows[row], **changes)
        self.dataChanged.emit(self.index(row), self.index(row))

    def row_of_call(self, call_id: str) -> int:
        """The row of tool call ``call_id``, or -1."""
        return next((i for i, r in enumerate(self._rows) if r.role == "tool" and r.call_id == call_id), -1)

    def append_text(self, text: str) -> None:
        """Add streamed text to the last row (its thinking, if any, has ended)."""
        if self._rows:
            self.update_last(content=self._rows[-1].content + text, thinking=False)

    def append_reasoning(self, text: str) -> None:
        """Add streamed thinking to the last row (one piece per sampled token, counted)."""
        if self._rows:
            last = self._rows[-1]
            self.update_last(reasoning=last.reasoning + text, reasoning_tokens=(last.reasoning_tokens or 0) + 1,
                             thinking=not last.content)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        r = self.item(index.row())
        if r is None:
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return r.content
        if role == ItemRole:
            return r
        if role == IdRole:
            return r.id
        if role == KindRole:
            return r.role
        if role == StatusRole:
            return r.status
        return None
