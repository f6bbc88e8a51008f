"""The Chats page: the conversation list | the chat (header, notes, bubbles, composer) | the chat's settings
panel, how it collapses instead of clipping on narrow windows, and the window's opening and minimum sizes.

Three widths (window px): *wide* (≥ ``COMPACT_WIDTH``) shows the list and the panel side by side; *compact*
(≥ ``NARROW_WIDTH``) and *narrow* show at most one of them beside the chat (compact starts with the list,
narrow with neither). Showing or hiding one is remembered per width; on a compact or narrow window, opening
one closes the other.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QScreen
from PySide6.QtWidgets import QFrame, QLabel, QSplitter, QVBoxLayout, QWidget

from app.ui import theme
from app.ui.chat_header import ChatHeader
from app.ui.chat_panel import WIDTH as PANEL_WIDTH
from app.ui.chat_panel import ChatPanel
from app.ui.chat_view import ChatView
from app.ui.labels import fit_width
from app.ui.models import ChatModel
from app.ui.sidebar import Sidebar

MIN_SIZE = QSize(640, 480)  # the window's minimum size, px: every page fits it (they scroll when shorter)
OPENING_SIZE = QSize(1280, 800)  # the window's size at start on a screen with room for it, px
FRAME = QSize(8, 40)  # room left for the window frame on the desktops we know, px
COMPACT_WIDTH = 1100  # below: the rail shows glyphs and one side panel shows at a time
NARROW_WIDTH = 800  # below: neither side panel shows until asked for (Chats again, Ctrl+Shift+L, the header)


def opening_size(screen: QScreen | None) -> QSize:
    """The window's size at start: ``OPENING_SIZE``, or less on a smaller ``screen`` (its frame stays inside
    the available area), never below ``MIN_SIZE``."""
    avail = screen.availableGeometry().size() - FRAME if screen is not None else OPENING_SIZE
    return OPENING_SIZE.boundedTo(avail).expandedTo(MIN_SIZE)


def width_mode(width: int) -> str:
    """"wide", "compact" or "narrow" for a window ``width`` px wide."""
    return "wide" if width >= COMPACT_WIDTH else "compact" if width >= NARROW_WIDTH else "narrow"


class ChatsPage(QSplitter):
    """``sidebar``, ``header``, ``chat``, ``panel`` and the chat's ``banner``, ``notice`` and ``error`` lines."""

    def __init__(self, store: object, chat_model: ChatModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.sidebar = Sidebar(store)
        self.header = ChatHeader()
        self.chat = ChatView(chat_model)
        self.panel = ChatPanel(self.chat.effort, self.chat.samples)
        self.banner = QLabel(wordWrap=True, visible=False, textFormat=Qt.TextFormat.RichText)
        self.banner.setObjectName("baseModelBanner")
        self.banner.setFrameShape(QFrame.Shape.StyledPanel)
        self.error = QLabel(wordWrap=True, visible=False, objectName="chatError")
        self.notice = QLabel(wordWrap=True, visible=False, objectName="chatNotice")
        center = QWidget()
        col = QVBoxLayout(center)
        col.setContentsMargins(0, theme.SPACE[1], theme.SPACE[1], theme.SPACE[1])
        col.setSpacing(theme.SPACE[1])
        for w in (self.header, self.banner, self.chat, self.notice, self.error):
            col.addWidget(w, 1 if w is self.chat else 0)
        for label in (self.banner, self.notice, self.error):
            fit_width(label)  # a long line wraps; it never widens the window
        for w in (self.sidebar, center, self.panel):
            self.addWidget(w)
        self.setChildrenCollapsible(False)
        self.setStretchFactor(1, 1)
        self.setSizes([250, 600, PANEL_WIDTH])
        self.mode = "wide"
        self.open = {"wide": {"list": True, "panel": True}, "compact": {"list": True, "panel": False},
                     "narrow": {"list": False, "panel": False}}
        self.header.panel_toggled.connect(lambda on: self.show_side("panel", on))

    def fit(self, width: int) -> str:
        """Lay the page out for a window ``width`` px wide; returns its width mode."""
        self.mode = width_mode(width)
        self._show()
        return self.mode

    def show_side(self, side: str, on: bool) -> None:
        """Show or hide ``side`` ("list" or "panel") at the present width (remembered for it)."""
        want = self.open[self.mode]
        want[side] = on
        if on and self.mode != "wide":
            want["panel" if side == "list" else "list"] = False  # one side panel at a time
        self._show()

    def _show(self) -> None:
        """Show the sides the present width's choice asks for."""
        want = self.open[self.mode]
        self.sidebar.setVisible(want["list"])
        self.panel.setVisible(want["panel"])
        self.header.set_panel(want["panel"])

    def toggle_list(self) -> None:
        """Show the conversation list if hidden, else hide it."""
        self.show_side("list", not self.open[self.mode]["list"])
