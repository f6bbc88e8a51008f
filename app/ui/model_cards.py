"""The curated models on the Models page as cards: one per model with its name, download size, fit on this
machine and licence, and its own Download button (issue 27). Nothing is selected: each card acts for itself,
so there is no "Download selected" to aim with a hidden current row.

The cards stack in a scroll area that scrolls up and down only. Every label word-wraps and takes the width its
layout gives it (``labels.fit_width``), so the list reads at 640 px and never widens the window; a button that
gets the keyboard focus scrolls its card into view.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QScrollArea, QVBoxLayout, QWidget

from app.catalog.recommended import Recommendation
from app.ui.labels import fit_width

DOWNLOAD, DOWNLOADING = "Download", "Downloading…"


def facts_text(r: Recommendation) -> str:
    """The card's second line: download size, quantization, licence ("Download 2.3 GiB · Q4_K_M · Licence:
    Apache-2.0"; "Download about 4.7 GiB (estimated from parameters) · …"; "Download size not listed · …")."""
    quant = r.quantization if r.quantization != "unknown" else "quantization unknown"
    return f"Download {r.size_text()} · {quant} · Licence: {r.license}"


def fit_class(r: Recommendation) -> str:
    """The colour class of the fit line (the stylesheet's ``QLabel#cardFit[fit=…]``): "good", "tight" (only
    just fits, or slow on a CPU), "bad" (too large) or "unknown"."""
    if r.verdict == "fits" and not r.slow:
        return "good"
    return {"fits": "tight", "tight": "tight", "won't fit": "bad"}.get(r.verdict, "unknown")


def _label(text: str, name: str) -> QLabel:
    label = fit_width(QLabel(text, objectName=name))
    label.setTextFormat(Qt.TextFormat.PlainText)  # names and blurbs are data, never markup
    return label


class RecommendationCard(QFrame):
    """One curated model: ``name``, ``facts`` (size, quantization, licence), ``fit`` and ``blurb`` labels and
    the ``download`` button, which emits ``requested(recommendation)``."""

    requested = Signal(object)

    def __init__(self, rec: Recommendation, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="modelCard")
        self.rec = rec
        self.name = _label(rec.name, "cardName")
        self.facts = _label(facts_text(rec), "cardFacts")
        self.fit = _label(rec.fit_text(), "cardFit")
        self.fit.setProperty("fit", fit_class(rec))
        self.blurb = _label(rec.blurb, "cardBlurb")
        self.download = QPushButton(DOWNLOAD)
        self.download.setAccessibleName(f"Download {rec.name}")
        self.download.setAccessibleDescription(f"{facts_text(rec)}. {rec.fit_text()}.")
        self.download.setToolTip(f"Download {rec.file} from {rec.repo} on Hugging Face")
        self.download.clicked.connect(lambda: self.requested.emit(self.rec))
        self.setAccessibleName(rec.name)
        self.setAccessibleDescription(f"{facts_text(rec)}. {rec.fit_text()}. {rec.blurb}")
        text = QVBoxLayout()
        text.setSpacing(2)
        for w in (self.name, self.facts, self.fit, self.blurb):
            text.addWidget(w)
        lay = QHBoxLayout(self)
        lay.addLayout(text, 1)
        lay.addWidget(self.download, 0, Qt.AlignmentFlag.AlignTop)

    def set_busy(self, busy: bool, current: tuple[str, str] | None) -> None:
        """A download runs (``current``: its repo and file, None when unknown): every button waits, and this
        card's says "Downloading…" when the download is its model."""
        mine = busy and current == (self.rec.repo, self.rec.file)
        self.download.setEnabled(not busy)
        self.download.setText(DOWNLOADING if mine else DOWNLOAD)


class RecommendationList(QScrollArea):
    """The cards, top to bottom in the order given; ``requested(recommendation)`` when a card's Download is
    pressed. Before ``set_recommendations`` it shows ``placeholder``."""

    requested = Signal(object)

    def __init__(self, placeholder: str = "Reading this machine's memory…", parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="recommendedCards")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # the labels wrap instead
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # the cards' buttons take the focus, not the frame
        self.cards: list[RecommendationCard] = []
        self._busy: tuple[bool, tuple[str, str] | None] = (False, None)
        self._column = QWidget(objectName="recommendedColumn")
        self._lay = QVBoxLayout(self._column)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self.placeholder = _label(placeholder, "cardBlurb")
        self._lay.addWidget(self.placeholder)
        self._lay.addStretch(1)
        self.setWidget(self._column)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt API
        """Room for the first card whole at the list's width: a long message elsewhere on the page makes the
        page scroll, it never squeezes the list to part of a card."""
        hint = super().minimumSizeHint()
        if not self.cards:
            return hint
        card, width = self.cards[0], self.viewport().width()
        need = card.heightForWidth(width) if card.hasHeightForWidth() and width > 0 else card.sizeHint().height()
        return QSize(hint.width(), max(hint.height(), need + 2 * self.frameWidth()))

    def resizeEvent(self, e: QResizeEvent) -> None:  # noqa: N802 - Qt API
        """A new width wraps the cards anew: the minimum height follows."""
        super().resizeEvent(e)
        if e.size().width() != e.oldSize().width():
            self.updateGeometry()

    def set_recommendations(self, recs: list[Recommendation]) -> None:
        """Show one card per model of ``recs`` (replacing any shown), in that order."""
        for card in self.cards:
            self._lay.removeWidget(card)
            card.hide()
            card.deleteLater()
        self.cards = [RecommendationCard(r, self._column) for r in recs]
        for i, card in enumerate(self.cards):
            self._lay.insertWidget(i, card)
            card.requested.connect(self.requested)
            card.download.installEventFilter(self)
            card.set_busy(*self._busy)
        self.placeholder.setVisible(not self.cards)
        self.placeholder.setText("No models listed.")
        self.updateGeometry()

    def set_busy(self, busy: bool, current: tuple[str, str] | None = None) -> None:
        """A download runs or ended (``RecommendationCard.set_busy``); kept for cards shown later."""
        self._busy = (busy, current)
        for card in self.cards:
            card.set_busy(busy, current)

    def buttons(self) -> list[QPushButton]:
        """The cards' Download buttons, top to bottom (the tab order after ``chain_after``)."""
        return [c.download for c in self.cards]

    def chain_after(self, before: QWidget) -> None:
        """Put the Download buttons in the tab order right after ``before``, top to bottom (cards are made
        after the rest of the page, so they would otherwise come last)."""
        prev = before
        for b in self.buttons():
            QWidget.setTabOrder(prev, b)
            prev = b

    def eventFilter(self, obj: QObject, e: QEvent) -> bool:  # noqa: N802 - Qt API
        """A Download button that gets the focus (Tab from outside the list too) scrolls its card into view."""
        if e.type() == QEvent.Type.FocusIn and isinstance(obj, QPushButton):
            self.ensureWidgetVisible(obj.parentWidget())
        return super().eventFilter(obj, e)

    def card_of(self, rec_id: str) -> RecommendationCard | None:
        """The card of the model with id ``rec_id``, else None."""
        return next((c for c in self.cards if c.rec.id == rec_id), None)
