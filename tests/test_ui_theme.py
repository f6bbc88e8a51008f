"""The theme (app.ui.theme, app.ui.prefs): light and dark from one set of tokens, the system scheme followed
live, the manual override saved in ui.json, and views re-rendered on a switch."""

from __future__ import annotations

import json
import re

import pytest
from PySide6.QtGui import QGuiApplication, QPalette

from app.ui import prefs, theme

pytestmark = pytest.mark.gui


@pytest.fixture
def manager(qapp):
    m = theme.manager()
    yield m
    m.set_mode("light")


def test_modes_resolve(qapp):
    assert theme.resolve("light") == "light" and theme.resolve("dark") == "dark"
    assert theme.resolve("system") == theme.system_scheme()
    with pytest.raises(ValueError, match="system, light, dark"):
        theme.resolve("sepia")


@pytest.mark.parametrize("name", ["light", "dark"])
def test_the_stylesheet_uses_only_the_tokens(name):
    sheet = theme.stylesheet(name)
    colours = set(re.findall(r"#[0-9a-fA-F]{6}\b", sheet))
    tokens = {v for k, v in vars(theme.PALETTES[name]).items() if k != "pygments_style"}
    assert colours and colours <= tokens
    sizes = {int(n) for n in re.findall(r"font-size: (\d+)px", sheet)}
    assert sizes <= set(range(theme.TYPE["small"], theme.TYPE["heading"] + 1))
    for role in ("userMessage", "assistantMessage", "toolCall", "reasoningText", "thinkingToggle", "statusStrip"):
        assert role in sheet


def test_switching_applies_palette_stylesheet_and_signal(manager, qapp):
    seen: list[str] = []
    manager.changed.connect(seen.append)
    manager.set_mode("dark")
    assert theme.current() == "dark" and manager.mode == "dark"
    assert qapp.palette().color(QPalette.ColorRole.Window).name() == theme.PALETTES["dark"].window
    assert theme.PALETTES["dark"].user_bubble in qapp.styleSheet()
    manager.set_mode("light")
    assert qapp.palette().color(QPalette.ColorRole.Base).name() == theme.PALETTES["light"].surface
    assert seen == ["dark", "light"]
    manager.changed.disconnect(seen.append)


def test_system_mode_follows_the_os_live(manager, monkeypatch):
    hints = QGuiApplication.styleHints()
    manager.set_mode("system")
    monkeypatch.setattr(theme, "system_scheme", lambda: "dark")
    hints.colorSchemeChanged.emit(hints.colorScheme())
    assert theme.current() == "dark"
    manager.set_mode("light")  # a manual choice is not overridden by the OS
    hints.colorSchemeChanged.emit(hints.colorScheme())
    assert theme.current() == "light"


def test_prefs_survive_a_restart_and_a_bad_file_gives_defaults():
    assert prefs.load_prefs().theme == "system"
    prefs.save_prefs(prefs.UiPrefs(theme="dark"))
    assert json.loads(prefs.prefs_file().read_text()) == {"theme": "dark"}
    assert prefs.load_prefs().theme == "dark"
    prefs.prefs_file().write_text('{"theme": "sepia"}')
    assert prefs.load_prefs().theme == "system"
    prefs.prefs_file().write_text("{nope")
    assert prefs.load_prefs().theme == "system"
    prefs.prefs_file().write_text("[" * 100_000 + "]" * 100_000)  # was a RecursionError: the window never opened
    assert prefs.load_prefs().theme == "system"
    with pytest.raises(ValueError, match="theme"):
        prefs.save_prefs(prefs.UiPrefs(theme="sepia"))


def test_settings_page_offers_the_theme(manager, qtbot):  # its choice is previewed: manager resets it
    from app.settings import UserSettings
    from app.ui.settings_page import SettingsPage

    prefs.save_prefs(prefs.UiPrefs(theme="light"))
    dlg = SettingsPage(UserSettings(), None)
    qtbot.addWidget(dlg)
    assert dlg.theme.currentData() == "light"
    dlg.theme.setCurrentIndex(dlg.theme.findData("dark"))
    assert dlg.apply() and dlg.new_theme == "dark"


def test_chat_view_renders_again_on_a_switch(manager, qtbot):
    from app.ui.chat_view import ChatView
    from app.ui.models import ChatModel, ChatRow

    model = ChatModel()
    view = ChatView(model)
    qtbot.addWidget(view)
    model.set_rows([ChatRow("a", "assistant", "```python\nx = 1\n```", reasoning="hmm", reasoning_tokens=1)])
    w = view.widgets[0]
    fmt = w.body.document().begin().blockFormat()
    assert fmt.background().color().name() == theme.PALETTES["light"].code_bg
    manager.set_mode("dark")
    fmt = w.body.document().begin().blockFormat()
    assert fmt.background().color().name() == theme.PALETTES["dark"].code_bg
    assert w.thinking.isVisibleTo(w) and w.thinking.objectName() == "thinkingToggle"


def test_screenshots_were_rendered_from_the_current_ui():
    """docs/screenshots/{page}-{size}-{theme}.png come from the UI code as it is now, every page at every size
    in both themes: docs/screenshots/render_window.py wrote the hash of app/ui's sources into manifest.json with
    them."""
    import importlib.util
    from pathlib import Path

    shots = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
    spec = importlib.util.spec_from_file_location("render_window", shots / "render_window.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    manifest = json.loads((shots / "manifest.json").read_text())
    assert manifest["ui_source_hash"] == render.ui_source_hash(), (
        "app/ui changed since the screenshots were rendered: run `flock /tmp/hearth-cpu.lock .venv/bin/python "
        "docs/screenshots/render_window.py` and commit docs/screenshots")
    assert manifest["pages"] == list(render.PAGES) and manifest["themes"] == ["light", "dark"]
    assert manifest["sizes"] == ["1280x800", "1440x900", "900x700", "hidpi"]
    wanted = {f"{p}-{s}-{t}.png" for p in render.PAGES for s in manifest["sizes"] for t in manifest["themes"]}
    assert wanted <= set(manifest["files"]), sorted(wanted - set(manifest["files"]))
    for name, digest in manifest["files"].items():
        assert render.file_hash(shots / name) == digest, f"{name} is not the one the manifest records"
    shown = " ".join(str(manifest[k]) for k in ("answer", "status", "context"))
    assert manifest["answer"].strip() and "/tmp" not in shown and "[E:" not in shown
    assert "/ 1 tokens" not in manifest["context"]
