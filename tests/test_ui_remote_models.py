"""Remote engines in the window's model list (issue 15): each entry of settings.remotes is a row, and loading
it connects the window's engine to the remote (``engine_ctl.remote_job`` → ``app.backends`` → ``RemoteEngine``, whose
behaviour against real servers is tests/test_remote_real.py). Checked here: the row, its details, a missing
key named, and the connect call with the remote's URL, model and key."""

from __future__ import annotations

import pytest

from app import backends
from app.catalog.registry import ModelEntry
from app.settings import RemoteSettings, UserSettings
from app.ui.model_panel import REMOTE, list_models_job, remote_html

pytestmark = pytest.mark.gui

FAR = RemoteSettings(url="http://10.0.0.5:8000/v1", model="qwen3-32b", api_key_env="FAR_KEY").validate("far")


def test_remote_rows_follow_the_installed_models():
    rows = list_models_job({"far": FAR})
    assert isinstance(rows[-1], ModelEntry) and rows[-1].id == "far" and rows[-1].path == REMOTE + "far"
    assert rows[-1].error is None and rows[-1].info is None
    html = remote_html("far", FAR)
    assert "10.0.0.5:8000" in html and "qwen3-32b" in html and "measured at Hearth" in html


def test_loading_a_remote_row_connects_with_its_key_or_names_the_missing_variable(qtbot, monkeypatch):
    from app.ui.context import AppContext
    from app.ui.model_panel import ModelPanel

    ctx = AppContext()
    ctx.settings = UserSettings(remotes={"far": FAR})
    calls = []
    monkeypatch.setattr(ctx.engine, "load", calls.append)
    panel = ModelPanel(ctx)
    qtbot.addWidget(panel)
    panel._entries(list_models_job(ctx.settings.remotes))
    row = panel.model.row_of_path(REMOTE + "far")
    assert row >= 0 and "remote engine · qwen3-32b" in panel.model.data(panel.model.index(row))
    panel.view.setCurrentIndex(panel.model.index(row))
    monkeypatch.delenv("FAR_KEY", raising=False)
    panel.load_selected()
    assert calls == [] and "FAR_KEY" in panel.error.text()
    monkeypatch.setenv("FAR_KEY", "sk-test")
    panel.load_selected()
    (job,) = calls  # built by app.backends from the remote's settings (URL, model, n_ctx, timeouts, key)
    assert job.path == "far" and job.remote == "http://10.0.0.5:8000/v1" and job.plan.remote == FAR
    eng = backends.build(job.plan)
    assert eng.url == FAR.url and eng.model == "qwen3-32b" and eng.key_hint == "$FAR_KEY"
    ctx.pool.pool.waitForDone(5000)


def test_settings_adds_and_removes_a_remote_and_keeps_a_typed_key_out_of_the_settings(qtbot, monkeypatch):
    from app import secrets
    from app.ui.settings_page import SettingsPage

    stored = {}
    monkeypatch.setattr(secrets, "store_key", lambda name, key: stored.__setitem__(name, key))
    dlg = SettingsPage(UserSettings(), None)
    qtbot.addWidget(dlg)
    page = dlg.remotes
    page.name.setText("far")
    page.url.setText("ftp://nowhere")
    assert page.add() is False and "url" in page.error.text().lower()  # the bad field is named
    page.url.setText("http://10.0.0.5:8000/v1")
    page.key_env.setText("FAR_KEY")
    assert page.add() and page.list.count() == 1
    page.name.setText("vault")
    page.in_keyring.setChecked(True)
    page.key.setText("sk-secret")
    assert page.add() and page.key.text() == ""
    assert dlg.apply()
    s = dlg.new_settings
    assert set(s.remotes) == {"far", "vault"} and s.remotes["far"].api_key_env == "FAR_KEY"
    assert s.remotes["vault"].api_key_keyring and stored == {"vault": "sk-secret"}
    assert "sk-secret" not in str(s.to_dict())  # the key is in the keyring only
    dlg2 = SettingsPage(s, None)
    qtbot.addWidget(dlg2)
    dlg2.remotes.list.setCurrentRow(0)
    dlg2.remotes.remove_selected()
    assert set(dlg2.remotes.result_remotes()) == {"vault"}
