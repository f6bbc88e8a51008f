"""The navigation rail at the window's left edge: one button per page (Chats, Documents, Models, Tools, Port,
Settings), as in LM Studio and Jan. Ctrl+1…Ctrl+6 choose a page (the window's actions); below the window's
compact width the rail shows its glyphs only (each keeps its name for screen readers and in its tooltip).
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QButtonGroup, QFrame, QPushButton, QVBoxLayout, QWidget

PAGES = (("chats", "✉", "Chats"), ("documents", "▤", "Documents"), ("models", "◈", "Models"),
         ("tools", "⚒", "Tools"), ("port", "⇄", "Port"), ("settings", "⚙", "Settings"))
# glyphs from the fonts every desktop has (DejaVu Sans and the like): emoji need an emoji font, often absent


class NavRail(QFrame):
    """A column of checkable buttons, one per page of ``PAGES``; emits ``page_chosen(name)``.

    ``buttons``: page name → its ``QPushButton`` (accessible name = the page's title; its tooltip names the
    window's shortcut, Ctrl+N for the N-th page)."""

    page_chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("navRail")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 8, 4, 8)
        lay.setSpacing(2)
        self.group = QButtonGroup(self, exclusive=True)
        self.buttons: dict[str, QPushButton] = {}
        for i, (name, glyph, title) in enumerate(PAGES, start=1):
            b = QPushButton(checkable=True, flat=True)  # a tool button drops its Tab focus when polished
            b.setObjectName(f"nav_{name}")
            b.setAccessibleName(title)
            b.setToolTip(f"{title} (Ctrl+{i})")
            b.setProperty("glyph", glyph)
            b.setProperty("title", title)
            b.clicked.connect(lambda _c=False, n=name: self.page_chosen.emit(n))
            self.group.addButton(b)
            self.buttons[name] = b
            lay.addWidget(b)
            if name == "port":
                lay.addStretch(1)  # Settings sits at the bottom, as in the apps people know
        self.set_compact(False)
        self.set_current("chats")

    def set_current(self, name: str) -> None:
        """Check the button of page ``name`` (no signal)."""
        self.buttons[name].setChecked(True)

    def current(self) -> str:
        """The name of the checked page."""
        return next(n for n, b in self.buttons.items() if b.isChecked())

    def set_compact(self, compact: bool) -> None:
        """Glyphs only (``True``, narrow windows) or glyph over title; the width follows."""
        for b in self.buttons.values():
            glyph, title = b.property("glyph"), b.property("title")
            b.setText(glyph if compact else f"{glyph}\n{title}")
            b.setFixedWidth(40 if compact else 80)
        self.setFixedWidth(48 if compact else 88)
