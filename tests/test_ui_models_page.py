"""Issue 27, defect 11 and "model picker and catalog": the Models page lists every curated model as a card
(size, fit on this machine, licence, its own Download button, nothing selected), a running Hugging Face
search can be cancelled, every control is named and reachable by Tab, and the page reads at 640 and 900 px.
Offscreen, with a fake Hub (no network, no model)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractButton, QAbstractItemView, QApplication, QLabel, QLineEdit, QListWidget

from app.catalog.recommended import load_catalog

pytestmark = pytest.mark.gui

RAIL = 88  # px: the navigation rail's widest (app/ui/nav_rail.py); the page gets the rest of the window


def settle(qtbot) -> None:
    for _ in range(3):
        QApplication.processEvents()
        qtbot.wait(20)


@pytest.fixture
def page(qtbot):
    from app.ui import theme
    from app.ui.context import AppContext
    from app.ui.model_panel import ModelPanel

    theme.manager().set_mode("light")  # the application stylesheet: its paddings count in the widths
    ctx = AppContext()
    panel = ModelPanel(ctx)
    qtbot.addWidget(panel)
    panel.resize(900 - RAIL, 900)
    panel.show()
    yield panel
    panel.close()
    ctx.close()
    assert ctx.pool.active == 0


class BlockingApi:
    """A Hub API whose searches wait for their own event and answer one repository named after the call."""

    def __init__(self) -> None:
        self.calls: list[threading.Event] = []

    def list_models(self, **kw):
        release = threading.Event()
        self.calls.append(release)
        release.wait(10)
        return [SimpleNamespace(id=f"org/answer-{len(self.calls)}-GGUF", downloads=1)]


# -- cards ---------------------------------------------------------------------------------------------------
def test_every_curated_model_is_a_card_with_size_fit_and_licence_none_selected(qtbot, page):
    page.show_recommendations(8 << 30, None)  # 8 GiB of RAM, no GPU
    settle(qtbot)
    cards = page.recommended.cards
    catalog = load_catalog()
    assert len(cards) == len(catalog) >= 8  # every model, not the one the list used to show
    assert {c.rec.id for c in cards} == {r.id for r in catalog}
    fits = [c.fit.text() for c in cards]
    first_large = next(i for i, t in enumerate(fits) if t.startswith("Too large"))
    assert first_large >= 4 and all(t.startswith("Fits in RAM") for t in fits[:first_large])
    assert all(t.startswith("Too large for this machine: needs about ") for t in fits[first_large:])
    gemma = page.recommended.card_of("gemma-3-4b-it-q4_k_m")
    assert gemma.name.text() == "Gemma 3 4B Instruct"
    assert gemma.facts.text() == "Download 2.3 GiB · Q4_K_M · Licence: Gemma Terms of Use"
    qwen = page.recommended.card_of("qwen3-8b-q4_k_m")
    assert qwen.facts.text() == ("Download about 4.7 GiB (estimated from parameters) · Q4_K_M · "
                                 "Licence: Apache-2.0")
    assert page.recommended.card_of("phi-4-mini-instruct-q4_k_m").facts.text().endswith("Licence: MIT")
    assert all(c.download.text() == "Download" and c.download.isEnabled() for c in cards)
    assert all(c.fit.property("fit") in ("good", "bad") for c in cards)
    # nothing is pre-selected: no list of the page has a current row, no card button is the default
    assert all(lw.currentRow() == -1 for lw in page.findChildren(QListWidget))
    assert not any(c.download.isDefault() or c.download.hasFocus() for c in cards)


def test_a_cards_download_button_downloads_that_model(qtbot, page, hearth_home):
    from app.catalog.hub import HubClient

    release, calls = threading.Event(), []

    def download(repo_id, filename, local_dir, tqdm_class):
        calls.append((repo_id, filename))
        release.wait(10)
        path = Path(local_dir) / filename
        path.write_bytes(b"not really a model")
        return str(path)

    page.ctx.downloads.client = HubClient(api=BlockingApi(), download=download, probe=lambda: None)
    page.show_recommendations(64 << 30, None)
    settle(qtbot)
    cards = page.recommended.cards
    card = cards[2]
    card.download.click()
    qtbot.waitUntil(lambda: bool(calls), timeout=5_000)
    assert calls == [(card.rec.repo, card.rec.file)]
    assert card.download.text() == "Downloading…" and not any(c.download.isEnabled() for c in cards)
    assert cards[0].download.text() == "Download"
    release.set()
    qtbot.waitUntil(lambda: cards[0].download.isEnabled(), timeout=5_000)
    assert card.download.text() == "Download" and card.rec.file in page.dl_label.text()


def test_cards_shown_while_a_download_runs_wait_too(qtbot, page):
    page.recommended.set_busy(True, ("org/x", "x.gguf"))
    page.show_recommendations(8 << 30, None)
    assert not any(b.isEnabled() for b in page.recommended.buttons())
    page.recommended.set_busy(False)
    assert all(b.isEnabled() for b in page.recommended.buttons())


# -- search cancel -------------------------------------------------------------------------------------------
def test_a_running_search_can_be_cancelled_and_its_answer_is_dropped(qtbot, page):
    from app.catalog.hub import HubClient

    api = BlockingApi()
    page.ctx.downloads.client = HubClient(api=api, probe=lambda: None)
    page.query.setText("qwen gguf")
    assert not page.search_cancel_btn.isVisibleTo(page)
    page.search_btn.click()
    qtbot.waitUntil(lambda: len(api.calls) == 1, timeout=5_000)
    assert page.search_cancel_btn.isVisibleTo(page) and not page.search_btn.isEnabled()
    page.search_cancel_btn.click()  # idle at once, while the request still waits
    assert page.search_btn.isEnabled() and page.query.isEnabled() and page.search_btn.text() == "Search"
    assert page.dl_label.text() == "Search cancelled" and not page.search_cancel_btn.isVisibleTo(page)
    page.search_btn.click()  # a new search; the cancelled one's end must not end it
    qtbot.waitUntil(lambda: len(api.calls) == 2, timeout=5_000)
    api.calls[0].set()
    qtbot.waitUntil(lambda: page.ctx.pool.active == 1, timeout=5_000)
    settle(qtbot)
    assert page.results.count() == 0 and not page.search_btn.isEnabled()  # the first answer was dropped
    api.calls[1].set()
    qtbot.waitUntil(lambda: page.search_btn.isEnabled(), timeout=5_000)
    assert [page.results.item(i).text().split()[0] for i in range(page.results.count())] == [
        "org/answer-2-GGUF"]
    assert page.dl_label.text() == "1 repositories found."
    assert page.ctx.downloads.cancel_search() is False  # nothing runs


# -- keyboard and screen readers -----------------------------------------------------------------------------
def test_every_control_is_named_and_the_cards_come_in_tab_order(qtbot, page):
    page.show_recommendations(8 << 30, None)
    settle(qtbot)
    controls = [w for kind in (QAbstractButton, QLineEdit, QAbstractItemView) for w in page.findChildren(kind)]
    assert len(controls) > len(page.recommended.cards) + 10
    for w in controls:
        assert w.accessibleName(), f"{type(w).__name__} {getattr(w, 'text', lambda: '')()!r} has no name"
        assert w.focusPolicy() & Qt.FocusPolicy.TabFocus, w.accessibleName()
    names = [c.download.accessibleName() for c in page.recommended.cards]
    assert names[0].startswith("Download ") and len(set(names)) == len(names)
    chain, w = [], page.abort_btn.nextInFocusChain()
    while w is not page.abort_btn and len(chain) < 200:
        chain.append(w)
        w = w.nextInFocusChain()
    buttons = page.recommended.buttons()
    at = chain.index(buttons[0])
    assert chain[at:at + len(buttons)] == buttons  # top to bottom, right after the installed models' buttons
    assert at < chain.index(page.query)
    page.activateWindow()
    buttons[0].setFocus()
    qtbot.keyClick(buttons[0], Qt.Key.Key_Tab)
    assert QApplication.focusWidget() is buttons[1]


# -- narrow windows ------------------------------------------------------------------------------------------
def _clipped(label: QLabel) -> str | None:
    """Why ``label`` shows less than its text (None when it shows all of it): a word wider than the label, or
    wrapped lines taller than it; a one-line label cut without its text in a tooltip."""
    from app.ui.labels import ElidedLabel

    text, room = label.text(), label.contentsRect().width() - 2 * label.margin()
    fm = label.fontMetrics()
    if isinstance(label, ElidedLabel):
        return None if fm.horizontalAdvance(text) <= room or label.toolTip() == text else "cut, no tooltip"
    if label.textFormat() == Qt.TextFormat.RichText or "<" in text:
        return None  # rich text (the details) is checked through its plain words below
    if label.wordWrap():
        wide = [w for w in text.split() if fm.horizontalAdvance(w) > room]
        if wide:
            return f"word {wide[0]!r} wider than {room} px"
        if label.height() < label.heightForWidth(label.width()):
            return f"{label.height()} px high, needs {label.heightForWidth(label.width())}"
        return None
    return None if fm.horizontalAdvance(text) <= room else f"{fm.horizontalAdvance(text)} px in {room}"


@pytest.mark.parametrize("window_width", [900, 640])
def test_the_page_reads_at_narrow_widths(qtbot, page, window_width):
    page.show_recommendations(8 << 30, None)
    page.resize(window_width - RAIL, 900)
    settle(qtbot)
    assert page.minimumSizeHint().width() <= window_width - RAIL and page.width() == window_width - RAIL
    scroll = page.recommended
    assert scroll.widget().width() <= scroll.viewport().width()  # no sideways scrolling: the cards fit
    for card in scroll.cards:
        scroll.ensureWidgetVisible(card)
        settle(qtbot)
        assert card.geometry().right() <= scroll.widget().width()
        assert card.download.width() >= card.download.sizeHint().width()  # "Download" never cut
        for label in (card.name, card.facts, card.fit, card.blurb):
            why = _clipped(label)
            assert why is None, f"{card.rec.name}: {label.objectName()} {label.text()!r}: {why}"
    for label in page.findChildren(QLabel):
        if label.isVisible() and label.text():
            why = _clipped(label)
            assert why is None, f"{label.objectName() or label.accessibleName()}: {label.text()!r}: {why}"
    for b in page.findChildren(QAbstractButton):
        if b.isVisible():
            assert b.width() >= b.sizeHint().width(), f"{b.text()!r} cut at {window_width} px"


def test_a_long_model_name_wraps_instead_of_scrolling_the_list_sideways(qtbot, page):
    """Issue 27, defect 11: model names scrolled sideways at 1280 px."""
    from app.catalog.registry import ModelEntry

    name = "an-instruction-tuned-model-with-a-very-long-name-" * 3 + "Q4_K_M"
    page.model.set_entries([ModelEntry(name, f"/models/{name}.gguf", 5 << 30, error="not a GGUF file")])
    settle(qtbot)
    view = page.view
    assert not view.horizontalScrollBar().isVisible()
    rect = view.visualRect(page.model.index(0))
    assert rect.width() <= view.viewport().width() and rect.height() > view.fontMetrics().height()  # wrapped


def test_the_details_take_the_new_themes_colours(qtbot, page):
    """Issue 27: the details kept the colours of the theme they were first shown in (dark text on dark)."""
    from app.catalog.registry import ModelEntry
    from app.ui import theme

    page.model.set_entries([ModelEntry("broken", "/models/broken.gguf", 1 << 20, error="truncated file")])
    page.view.setCurrentIndex(page.model.index(0))
    assert theme.PALETTES["light"].error in page.details.text()
    theme.manager().set_mode("dark")
    try:
        assert theme.PALETTES["dark"].error in page.details.text()
        assert theme.PALETTES["light"].error not in page.details.text()
    finally:
        theme.manager().set_mode("light")


# -- issue 27 trial: a download while offline ----------------------------------------------------------------
class ConnectError(Exception):
    """Named like httpx's: the hub client knows connection errors by name."""


class LocalEntryNotFoundError(Exception):
    """Named like huggingface_hub's: what ``hf_hub_download`` raises, from the connection error, offline."""


def _offline_download(repo_id, filename, local_dir, tqdm_class):
    try:
        raise ConnectError("[Errno -3] Temporary failure in name resolution")
    except ConnectError as exc:
        raise LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub and we "
                                      "cannot find the requested files in the local cache.") from exc


def test_an_offline_download_says_so_in_plain_words_within_seconds(qtbot, page):
    """The trial: ~24 s of silent retries, then a raw LocalEntryNotFoundError ending "try again to resume"."""
    import time

    from app.catalog.hub import OFFLINE, HubClient

    calls: list[str] = []

    def no_network() -> None:
        raise OSError(101, "Network is unreachable")

    def download(**kw):
        calls.append(kw["filename"])
        return _offline_download(**kw)

    page.ctx.downloads.client = HubClient(download=download, probe=no_network)
    page.show_recommendations(64 << 30, None)
    settle(qtbot)
    start = time.monotonic()
    page.recommended.cards[0].download.click()
    qtbot.waitUntil(lambda: page.recommended.cards[0].download.isEnabled(), timeout=5_000)
    assert page.dl_label.text() == OFFLINE and calls == [] and time.monotonic() - start < 3
    page.ctx.downloads.client = HubClient(download=download, probe=lambda: None)  # the probe passed; then not
    page.recommended.cards[0].download.click()
    qtbot.waitUntil(lambda: page.recommended.cards[0].download.isEnabled(), timeout=5_000)
    assert page.dl_label.text() == OFFLINE and len(calls) == 1


def test_a_failed_download_offers_a_resume_only_when_something_came(tmp_path):
    import threading as th

    from app.catalog.hub import HubClient
    from app.errors import HearthError

    def cut(after: int):
        def download(repo_id, filename, local_dir, tqdm_class):
            bar = tqdm_class(total=100)
            if after:
                bar.update(after)
            raise RuntimeError("the server closed the connection")
        return download

    for after, ends in ((0, "; try again"), (40, "; try again to resume")):
        with pytest.raises(HearthError) as got:
            HubClient(download=cut(after), probe=lambda: None).download("org/r", "m.gguf", lambda *a: None,
                                                                         th.Event(), tmp_path)
        assert str(got.value).endswith(ends) and "RuntimeError" in str(got.value)
    full = OSError(28, "No space left on device")  # a file's error is named, never "no network"
    with pytest.raises(HearthError, match="No space left"):
        HubClient(download=lambda **kw: (_ for _ in ()).throw(full), probe=lambda: None).download(
            "org/r", "m.gguf", lambda *a: None, th.Event(), tmp_path)


def test_a_long_download_message_never_squeezes_the_cards(qtbot):
    """The trial at 1280x800: the raw error wrapped to five lines and left the Recommended box part of one
    card."""
    from app.errors import HearthError
    from tests.test_ui_first_hour import ready_window
    from tests.test_ui_reasoning import close_window

    w = ready_window(qtbot)
    try:
        w.resize(1280, 800)
        w.show_page("models")
        w.models.show_recommendations(64 << 30, None)
        settle(qtbot)
        card = w.models.recommended.cards[0]
        room = w.models.recommended.viewport().height()
        assert room >= card.height() > 0
        w.ctx.downloads.failed.emit(HearthError("download of org/repo/file.gguf failed: " + "long words " * 80))
        settle(qtbot)
        assert w.models.recommended.viewport().height() >= card.height()  # one whole card, at least
        assert w.models.dl_label.width() > w.models.width() // 2  # a line of its own, not beside the button
    finally:
        close_window(w)
