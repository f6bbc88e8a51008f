"""Issue 27, "accessible": text at least 4.5:1 and control borders at least 3:1 in both themes (WCAG 2.1 AA,
computed from the theme's tokens by ``app.ui.a11y``), and every control with an accessible name."""

from __future__ import annotations

import re

import pytest
from PySide6.QtGui import QColor

from app.ui import a11y, theme

THEMES = ("light", "dark")


# -- contrast: pure logic, from the tokens ------------------------------------------------------------------
@pytest.mark.parametrize(("fg", "bg", "ratio"), [
    ("#000000", "#ffffff", 21.0), ("#ffffff", "#ffffff", 1.0), ("#777777", "#ffffff", 4.48),
    ("#767676", "#ffffff", 4.54), ("#ff0000", "#ffffff", 4.0), ("#0000ff", "#ffffff", 8.59),
    ("#808080", "#000000", 5.32)])
def test_contrast_ratio_matches_known_values(fg, bg, ratio):
    assert a11y.contrast_ratio(fg, bg) == pytest.approx(ratio, abs=0.005)
    assert a11y.contrast_ratio(bg, fg) == a11y.contrast_ratio(fg, bg)  # either way round


def test_contrast_ratio_takes_qcolors_and_names_a_bad_argument():
    assert a11y.contrast_ratio(QColor("black"), QColor("#ffffff")) == pytest.approx(21.0)
    assert a11y.contrast_ratio(QColor("#767676"), "#ffffff") == a11y.contrast_ratio("#767676", "#ffffff")
    with pytest.raises(ValueError, match="fg"):
        a11y.contrast_ratio("white", "#ffffff")
    with pytest.raises(ValueError, match="bg"):
        a11y.contrast_ratio("#ffffff", "#fff")
    with pytest.raises(ValueError, match="theme_name"):
        a11y.token_pairs("sepia")


@pytest.mark.parametrize("name", THEMES)
def test_every_token_pair_meets_its_ratio(name):
    colours = theme.PALETTES[name]
    pairs = a11y.token_pairs(name)
    assert {kind for _fg, _bg, kind, _need in pairs} == set(a11y.RATIOS)
    failing = [f"{fg} on {bg} ({kind}): {a11y.contrast_ratio(getattr(colours, fg), getattr(colours, bg)):.2f}"
               for fg, bg, kind, need in pairs
               if a11y.contrast_ratio(getattr(colours, fg), getattr(colours, bg)) < need]
    assert failing == []
    assert a11y.contrast_failures(name) == []  # the code colours too


@pytest.mark.parametrize("name", THEMES)
def test_code_colours_are_readable_on_the_code_background(name):
    pairs = a11y.code_pairs(name)
    assert len(pairs) > 20  # the style has colours: the check is not vacuous
    assert [(token, colour) for token, colour, ratio in pairs if ratio < a11y.TEXT] == []


@pytest.mark.parametrize("name", THEMES)
def test_every_text_colour_of_the_stylesheet_has_a_checked_pair(name):
    """A rule that draws text in a token with no pair in ``a11y`` would escape the check above."""
    colours = vars(theme.PALETTES[name])
    sheet = theme.stylesheet(name)
    used = set(re.findall(r"(?<![-\w])color: (#[0-9a-fA-F]{6})", sheet))
    text_colours = {colours[fg] for fg, _bg, kind, _need in a11y.token_pairs(name) if kind == "text"}
    assert used and used <= text_colours
    for control in ("QPushButton {{", "QLineEdit, QPlainTextEdit, QComboBox {{"):
        rule = sheet.split(control.replace("{{", "{"), 1)[1].split("}", 1)[0]
        assert f"solid {colours['control_border']}" in rule


# -- accessible names ----------------------------------------------------------------------------------------
@pytest.mark.gui
def test_unnamed_controls_finds_an_unnamed_line_edit_and_accepts_named_ones(qtbot):
    from PySide6.QtWidgets import QComboBox, QFormLayout, QLabel, QLineEdit, QPushButton, QSpinBox, QWidget

    root = QWidget()
    qtbot.addWidget(root)
    form = QFormLayout(root)
    unnamed = QLineEdit(placeholderText="Search chats")  # a placeholder is not a name (Qt: the description)
    unnamed.setObjectName("search")
    named = QLineEdit()
    named.setAccessibleName("Message to the model")
    spin = QSpinBox()  # named by its buddy label; its inner line edit is part of it
    buddy = QLabel("&Port", buddy=spin)
    combo = QComboBox()  # Qt on Linux names it by its current item: a value, not a name
    combo.addItems(["light", "dark"])
    hidden = QLineEdit(visible=False)
    for w in (unnamed, named, buddy, spin, combo, hidden):
        form.addRow(w)
    form.addRow("Name", QLineEdit())  # a form label names its field
    form.addRow(QPushButton("Send"))  # a button's text is its name
    root.show()
    found = a11y.unnamed_controls(root)
    assert len(found) == 2, found
    assert found[0].startswith("QLineEdit#search") and "placeholder='Search chats'" in found[0]
    assert found[1].startswith("QComboBox")
    assert len(a11y.unnamed_controls(root, include_hidden=True)) == 3
    unnamed.setAccessibleName("Search chats")
    combo.setAccessibleName("Theme")
    assert a11y.unnamed_controls(root) == []
    assert a11y.accessible_name(spin) == "Port" and a11y.accessible_name(named) == "Message to the model"


@pytest.mark.gui
def test_unnamed_controls_finds_views_tab_stops_too(qtbot):
    """A read-only text view or a scroll area that Tab stops at is announced by name as a control is (issue 27
    trial, defect 6: the message views and the chat's scroll area were Tab stops without a name)."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QLabel, QScrollArea, QTextBrowser, QVBoxLayout, QWidget

    root = QWidget()
    qtbot.addWidget(root)
    lay = QVBoxLayout(root)
    view = QTextBrowser(objectName="answer")  # read-only: content, not a control, but Tab stops at it
    view.setPlainText("hello")
    scroll = QScrollArea(objectName="messages")  # Tab stops at a scroll area unless told not to
    quiet = QScrollArea(objectName="quiet")
    quiet.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # no Tab stop: its controls take the focus
    for w in (view, scroll, quiet, QLabel("text")):
        lay.addWidget(w)
    root.show()
    found = a11y.unnamed_controls(root)
    assert [d.split()[0] for d in found] == ["QTextBrowser#answer", "QScrollArea#messages"], found
    assert a11y.tab_order(root) == [view, scroll]
    view.setAccessibleName("Answer")
    scroll.setAccessibleName("Messages")
    assert a11y.unnamed_controls(root) == []


@pytest.mark.gui
def test_tab_reads_a_chat_in_order_header_messages_composer_panel(qtbot):
    """Issue 27 trial, defect 6: Tab went rail, list, header, composer, panel and only then to the messages'
    Copy / Edit / Regenerate; each message's stops now come after the header and before the composer, in the
    order the messages are read, for messages shown with the chat and for one added as it streams."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    from app.ui.models import ChatRow
    from tests.test_ui_first_hour import ready_window, settle
    from tests.test_ui_reasoning import close_window

    w = ready_window(qtbot)
    try:
        w.resize(1280, 800)  # wide: the list and the panel beside the chat
        w.chat_model.set_rows([ChatRow("u1", "user", "hello"), ChatRow("a1", "assistant", "hi", reasoning="hm"),
                               ChatRow("t1", "tool", "result", tool_state="ok"), ChatRow("u2", "user", "more")])
        settle(qtbot)
        w.chat_model.append(ChatRow("a2", "assistant", "again"))  # an answer added while the chat is shown
        settle(qtbot)
        order = a11y.tab_order(w)
        pos = {id(x): i for i, x in enumerate(order)}
        chat = w.chat
        stops = [[x for x in order if m.isAncestorOf(x)] for m in chat.widgets]
        assert all(stops) and [s[-1] for s in stops[:2]] == [chat.widgets[0].buttons["edit"],
                                                             chat.widgets[1].buttons["regenerate"]]
        flat = [pos[id(x)] for s in stops for x in s]
        assert flat == sorted(flat) and flat == list(range(flat[0], flat[0] + len(flat)))  # together, in order
        before = [w.sidebar.view, w.header.model_picker, chat.scroll]
        after = [chat.composer, chat.send_btn, w.panel.preset, w.panel.prompt]
        assert all(id(x) in pos for x in before + after), [a11y.describe(x) for x in before + after if x not in order]
        assert max(pos[id(x)] for x in before) < flat[0] and flat[-1] < min(pos[id(x)] for x in after)
        chat.scroll.setFocus()
        visited = []
        for _ in range(len(flat) + 1):  # real Tab presses: the messages' stops, then the message box
            qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
            visited.append(QApplication.focusWidget())
        assert visited == [x for s in stops for x in s] + [chat.composer]
    finally:
        close_window(w)


@pytest.mark.gui
def test_every_control_of_the_window_has_a_name(qtbot):
    """Every page of the window (hidden ones too), a message, a tool call and the Presets dialog."""
    from app.ui.chat_view import MessageWidget
    from app.ui.models import ChatRow
    from app.ui.presets_dialog import PresetsDialog
    from app.ui.tool_view import ToolCallWidget
    from tests.test_ui_first_hour import open_window
    from tests.test_ui_reasoning import close_window

    w = open_window(qtbot)
    try:
        parts = [w, MessageWidget(ChatRow("a", "assistant", "hi")), MessageWidget(ChatRow("u", "user", "hello")),
                 ToolCallWidget(ChatRow("t", "tool", "result", tool_state="asking")), PresetsDialog(w.ctx.store)]
        for part in parts[1:]:
            qtbot.addWidget(part)
        assert [d for part in parts for d in a11y.unnamed_controls(part, include_hidden=True)] == []
    finally:
        close_window(w)


@pytest.mark.gui
def test_tab_reaches_every_control_of_every_page(qtbot):
    """A keyboard path: on every page, each enabled control the person sees is in the Tab order."""
    from tests.test_ui_first_hour import open_window, settle
    from tests.test_ui_reasoning import close_window

    w = open_window(qtbot)
    try:
        for name in w.page_of:
            w.show_page(name)
            settle(qtbot)
            assert a11y.keyboard_unreachable(w) == [], name
    finally:
        close_window(w)


@pytest.mark.gui
def test_tab_leaves_every_text_box_and_types_nothing(qtbot):
    """Issue 27: Tab in the message box or a system prompt typed a tab (saved at once as the default system
    prompt) and the keyboard could not leave the box."""
    from PySide6.QtCore import Qt

    from tests.test_ui_first_hour import ready_window, settle
    from tests.test_ui_reasoning import close_window

    w = ready_window(qtbot)
    try:
        for page, box in (("chats", w.chat.composer), ("chats", w.panel.prompt),
                          ("settings", w.settings_page.system_prompt)):
            w.show_page(page)
            if box is w.settings_page.system_prompt:
                w.settings_page.sections.setCurrentRow(1)
            settle(qtbot)
            box.setFocus()
            qtbot.keyClick(box, Qt.Key.Key_Tab)
            assert box.toPlainText() == "" or "\t" not in box.toPlainText(), page
            assert not box.hasFocus(), f"{page}: Tab stayed in {box.objectName()}"
        assert "\t" not in w.ctx.settings.system_prompt
    finally:
        close_window(w)
