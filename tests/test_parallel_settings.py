"""``n_parallel`` (requests served at once) from every place a person sets it: ``--parallel`` on the engine
commands, ``load.n_parallel`` in settings.json, the Settings dialog's "Parallel requests" spin box, and the
memory estimate ``hearth inspect`` prints (KV counted per sequence). No model: bad values fail before any
loads, and inspect reads a tiny GGUF header."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytest
from gguf_writer import write_gguf

from app import paths
from app.cli import build_parser, main
from app.cli._engine_args import add_load_args, load_settings
from app.protocol.types import MAX_PARALLEL
from app.settings import load_user_settings


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_load_args(p)
    return p.parse_args(list(argv))


def write_settings(data: dict) -> None:
    paths.settings_file().write_text(json.dumps(data), encoding="utf-8")


# -------------------------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize("value", ["0", "-1", "65", "x", "2.5", ""])
def test_bad_parallel_is_one_line_naming_the_flag_before_anything_starts(value, capsys):
    assert main(["serve", "--parallel", value]) == 1  # no port bound, no model resolved or loaded
    err = capsys.readouterr().err
    assert err.startswith("hearth: error: --parallel must be an integer from 1 to 64 or auto")
    assert repr(value) in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_parallel_flag_overrides_the_saved_value_and_auto_is_none():
    write_settings({"load": {"n_parallel": 3}})
    assert load_settings(parse()).n_parallel == 3
    assert load_settings(parse("--parallel", "2")).n_parallel == 2
    assert load_settings(parse("--parallel", "auto")).n_parallel is None
    assert load_settings(parse("--parallel", str(MAX_PARALLEL))).n_parallel == MAX_PARALLEL
    write_settings({})
    assert load_settings(parse()).n_parallel is None  # the default: auto


def test_serve_help_says_what_parallel_is_and_its_default():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(sub.choices["serve"].format_help().split())
    assert "--parallel N" in text and "requests served at once" in text
    assert "default from settings: auto" in text and "n_ctx of KV cache" in text


# -------------------------------------------------------------------------------------- settings.json
@pytest.mark.parametrize("value", [0, -1, 65, "x", True, 2.5])
def test_bad_saved_parallel_falls_back_to_auto_with_a_warning_naming_it(value, caplog):
    write_settings({"load": {"n_parallel": value, "n_ctx": 2048}})
    with caplog.at_level(logging.WARNING, logger="app.settings"):
        s = load_user_settings()
    assert s.load.n_parallel is None and s.load.n_ctx == 2048  # the rest of the file is kept
    assert "load.n_parallel" in caplog.text


def test_saved_parallel_and_null_load_quietly(caplog):
    write_settings({"load": {"n_parallel": None}})
    with caplog.at_level(logging.WARNING, logger="app.settings"):
        assert load_user_settings().load.n_parallel is None
    assert caplog.text == ""
    write_settings({"load": {"n_parallel": 4}})
    assert load_user_settings().load.n_parallel == 4


# ------------------------------------------------------------------------------------------- inspect
def tiny(path: Path) -> Path:
    """1 layer, 1 KV head × 16 dims: 64 bytes of f16 KV per token."""
    return write_gguf(path, "llama", n_layer=1, context_length=128, embedding_length=32, feed_forward_length=64,
                      head_count=2, head_count_kv=1, n_vocab=10, template="{{ x }}")


def test_inspect_counts_the_kv_per_sequence(tmp_path, capsys):
    path = str(tiny(tmp_path / "tiny.gguf"))

    def memory(*flags: str) -> dict:
        assert main(["inspect", path, "--json", "--n-ctx", "512", *flags]) == 0
        return json.loads(capsys.readouterr().out)["memory"]

    one, three, auto = memory("--parallel", "1"), memory("--parallel", "3"), memory()
    assert one["kv_bytes"] == 512 * 64 and (one["n_parallel"], one["n_parallel_auto"]) == (1, False)
    assert three["kv_bytes"] == 3 * one["kv_bytes"] and three["n_parallel"] == 3
    assert auto["n_parallel_auto"] is True and auto["n_parallel"] == 4  # a tiny model: 4 fit
    assert auto["kv_bytes"] == 4 * one["kv_bytes"]
    assert main(["inspect", path, "--n-ctx", "512", "--parallel", "2"]) == 0
    out = capsys.readouterr().out
    assert "n_parallel 2," in out and "= 2 sequences × " in out and "512 cells each" in out
    assert main(["inspect", path]) == 0
    assert "n_parallel 4 (auto)" in capsys.readouterr().out


def test_inspect_bad_parallel_is_one_line(tmp_path, capsys):
    assert main(["inspect", str(tiny(tmp_path / "t.gguf")), "--parallel", "0"]) == 1
    err = capsys.readouterr().err
    assert "--parallel must be" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------- the Settings dialog
@pytest.mark.gui
def test_settings_page_parallel_spin_box_auto_and_a_number(qtbot):
    from PySide6.QtWidgets import QLabel

    from app.settings import UserSettings
    from app.ui.settings_page import SettingsPage

    dlg = SettingsPage(UserSettings(), None)
    qtbot.addWidget(dlg)
    assert "Parallel requests" in [w.text() for w in dlg.findChildren(QLabel)]
    spin = dlg.n_parallel
    assert spin.value() == 0 and spin.text() == "auto" and spin.maximum() == MAX_PARALLEL
    assert dlg.result_settings().load.n_parallel is None
    spin.setValue(3)
    out = dlg.result_settings()
    assert out.load.n_parallel == 3
    spin.setValue(MAX_PARALLEL + 1)  # clamped by the box: an out-of-range value cannot be entered
    assert dlg.result_settings().load.n_parallel == MAX_PARALLEL
    again = SettingsPage(out, None)
    qtbot.addWidget(again)
    assert again.n_parallel.value() == 3
    again.n_parallel.setValue(0)
    assert again.result_settings().load.n_parallel is None
