"""Labels that never widen the window.

A ``QLabel``'s minimum width is its text's width (one line) or its longest word (word-wrapped), and a layout
passes that up to the top-level window, which then grows past the screen and never shrinks back (issue 27: a
long status line took the window from 1280 to 1544 px). Status and error lines therefore ignore their text's
width: one-line labels are cut with "…" and carry the whole text as their tooltip (``ElidedLabel``); wrapped
labels have a minimum width of 1 px instead of their longest word's (``fit_width``). A whole page goes in a
scroll area (``scrolled``), which scrolls when the window is smaller than the page's minimum.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QLabel,
    QScrollArea,
    QStyle,
    QStyleOptionComboBox,
    QStylePainter,
    QWidget,
)


class ElidedLabel(QLabel):
    """One line of plain text cut with "…" to the label's width; when cut, the tooltip is the whole text (then
    the owner's tooltip, if any). ``text()`` is the whole text."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self._tip = ""  # a tooltip set by the owner, shown while the text fits
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt API
        """Show ``text`` (cut to the width)."""
        self._full = text
        self._elide()

    def text(self) -> str:
        """The whole text, cut or not."""
        return self._full

    def setToolTip(self, tip: str) -> None:  # noqa: N802 - Qt API
        """The owner's tooltip (while the text is cut, it follows the whole text)."""
        self._tip = tip
        self._elide()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt API
        """No minimum width: the label never pushes its window wider."""
        return QSize(0, super().minimumSizeHint().height())

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt API
        """The whole text's width, so that a roomy layout shows it uncut."""
        hint, fm = super().sizeHint(), self.fontMetrics()  # QLabel's, for the text shown now (margins included)
        extra = fm.horizontalAdvance(self._full) - fm.horizontalAdvance(QLabel.text(self))
        return QSize(hint.width() + max(extra, 0) + 1, hint.height())

    def resizeEvent(self, e: QResizeEvent) -> None:  # noqa: N802 - Qt API
        super().resizeEvent(e)
        self._elide()

    def _elide(self) -> None:
        room = self.contentsRect().width() - 2 * self.margin()
        shown = self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, max(room, 0))
        QLabel.setText(self, shown)
        cut = shown != self._full
        QLabel.setToolTip(self, (self._full + (f"\n\n{self._tip}" if self._tip else "")) if cut else self._tip)


def fit_width(label: QLabel) -> QLabel:
    """Make a word-wrapped ``label`` take the width its layout gives it, whatever its text (a word longer than
    the width is clipped). Returns ``label``."""
    label.setWordWrap(True)
    label.setMinimumWidth(1)  # an explicit minimum replaces the longest word's width in the layout
    return label


def scrolled(page: QWidget) -> QScrollArea:
    """``page`` in a frameless scroll area: shorter or narrower than the page's minimum size, it scrolls (it
    never clips and never widens the window). Returns the area (``area.widget()`` is ``page``)."""
    area = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
    area.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # Tab goes to the page's controls, not to an invisible stop
    area.setWidget(page)
    return area


class ElidedComboBox(QComboBox):
    """A combo box whose shown item is cut with "…" to its width (Qt's cuts it mid-word without a mark); the
    whole text is its tooltip."""

    def _option(self) -> QStyleOptionComboBox:
        opt = QStyleOptionComboBox()
        self.initStyleOption(opt)
        return opt

    def field_width(self) -> int:
        """The width of the part that shows the current item, px."""
        return self.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, self._option(),
                                           QStyle.SubControl.SC_ComboBoxEditField, self).width()

    def shown_text(self) -> str:
        """The current item's text as drawn (no current item: the placeholder text), cut with "…" to
        ``field_width``."""
        text = self.currentText() if self.currentIndex() >= 0 else self.placeholderText()
        return self.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight, self.field_width())

    def paintEvent(self, _e: object) -> None:  # noqa: N802 - Qt API
        p, opt = QStylePainter(self), self._option()
        p.drawComplexControl(QStyle.ComplexControl.CC_ComboBox, opt)
        opt.currentText = self.shown_text()
        p.drawControl(QStyle.ControlElement.CE_ComboBoxLabel, opt)
