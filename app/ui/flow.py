"""``FlowLayout``: a row of widgets that wraps onto more lines when the width runs out, like words in a
paragraph (Qt's "Flow Layout" example). A row of fixed controls in a plain ``QHBoxLayout`` has the sum of
their widths as its minimum, which at 640 px made a page scroll sideways (issue 27 trial, defect 2); in a
flow its minimum is the widest control's and its height follows the width (``heightForWidth``).
"""

from __future__ import annotations

from PySide6.QtCore import QMargins, QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QStyle, QWidget


class FlowLayout(QLayout):
    """Items left to right, wrapping to a new line when the next does not fit; ``spacing`` between items and
    lines (-1: the style's)."""

    def __init__(self, parent: QWidget | None = None, spacing: int = -1) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._spacing = spacing

    def addItem(self, item: QLayoutItem) -> None:  # noqa: N802 - Qt API
        """Qt's: take ``item`` at the end (``addWidget`` calls it)."""
        self._items.append(item)

    def count(self) -> int:
        """Qt's: the number of items."""
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 - Qt API
        """Qt's: the item at ``index``, else None."""
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 - Qt API
        """Qt's: remove and return the item at ``index``, else None."""
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:  # noqa: N802 - Qt API
        """Qt's: none (the items keep their size hints)."""
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt API
        """Qt's: yes, the lines depend on the width."""
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt API
        """Qt's: the height the items need at ``width``."""
        return self._place(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802 - Qt API
        """Qt's: place the items in ``rect``."""
        super().setGeometry(rect)
        self._place(rect, move=True)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt API
        """Qt's: every item on one line."""
        m, gap = self.contentsMargins(), self._gap()
        w = sum(i.sizeHint().width() for i in self._items) + gap * max(len(self._items) - 1, 0)
        h = max((i.sizeHint().height() for i in self._items), default=0)
        return QSize(w, h) + QSize(m.left() + m.right(), m.top() + m.bottom())

    def minimumSize(self) -> QSize:  # noqa: N802 - Qt API
        """Qt's: the widest item (each on a line of its own)."""
        size = QSize()
        for item in self._items:
            size = size.expandedTo(item.minimumSize().expandedTo(item.sizeHint()))
        m = self.contentsMargins()
        return size + QSize(m.left() + m.right(), m.top() + m.bottom())

    def _gap(self) -> int:
        if self._spacing >= 0:
            return self._spacing
        parent = self.parentWidget()
        style = parent.style() if parent is not None else None
        return style.pixelMetric(QStyle.PixelMetric.PM_LayoutHorizontalSpacing) if style else 6

    def _place(self, rect: QRect, move: bool) -> int:
        """Lay the items out in ``rect`` (moving them when ``move``); returns the height used."""
        m: QMargins = self.contentsMargins()
        area = rect.marginsRemoved(m)
        gap = max(self._gap(), 0)
        x, y, line = area.x(), area.y(), 0
        for item in self._items:
            if item.isEmpty():
                continue
            hint = item.sizeHint()
            if x > area.x() and x + hint.width() > area.right() + 1:
                x, y, line = area.x(), y + line + gap, 0
            if move:
                item.setGeometry(QRect(QPoint(x, y), hint))
            x += hint.width() + gap
            line = max(line, hint.height())
        return y + line - rect.y() + m.bottom()
