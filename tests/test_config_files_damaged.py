"""Damaged config files never stop Hearth (issue 29, item 6).

An ``mcp.json`` cut inside a multi-byte character or nested 5,000 deep stopped ``hearth gui`` with a traceback;
a deeply nested ``settings.json`` stopped every command (RecursionError). Both files are now read by
``app.fileio.read_json_file``: every damage is a clear error naming the file, where and what to do; settings
fall back to the defaults; a damaged file is kept (``<name>.corrupt-<UTC time>``), never written over.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from app import paths
from app.errors import HearthError
from app.fileio import JsonFileError, read_json_file
from app.mcp import McpConfig, McpConfigError, load_config, parse_config, save_config
from app.settings import UserSettings, load_user_settings, save_user_settings

REPO = Path(__file__).resolve().parents[1]


def nested(depth: int, close: bool = True) -> bytes:
    return b'{"x": ' + b"[" * depth + (b"]" * depth if close else b"") + b"}"


# (file content, words the error must hold, whether it names a line)
DAMAGE = {
    "cut inside a multibyte character": (
        '{"mcpServers": {}, "system_prompt": "caf\u00e9 \u20ac'.encode()[:-2], "cut short", True),
    "invalid utf-8 in the middle": (b'{"system_prompt": "\xff\xfe"}', "not UTF-8", True),
    "5,000 deep": (nested(5000), "nested deeper than 64 levels", True),
    "100,000 deep": (nested(100_000), "nested deeper than 64 levels", True),
    "100,000 deep, cut short": (nested(100_000, close=False), "nested deeper than 64 levels", True),
    "lone surrogate escape": (b'{"system_prompt": "a\\ud800b"}', "system_prompt holds a lone surrogate", False),
    "lone surrogate key": (b'{"mcpServers": {}, "\\udc80": 1}', "lone surrogate", False),
    "lone surrogate bytes": (b'{"system_prompt": "\xed\xa0\x80"}', "not UTF-8", True),
    "top level is a list": (b"[1, 2, 3]", "must hold a JSON object", False),
    "top level is a string": (b'"settings"', "must hold a JSON object", False),
    "top level is null": (b"null", "must hold a JSON object", False),
    "empty": (b"", "empty", False),
    "only whitespace": (b" \n\t\n", "empty", False),
    "cut short": (b'{"system_prompt": "hello", "load": {"n_ctx": 4', "ends too early", True),
    "unterminated string": (b'{"system_prompt": "hel', "ends too early", True),
}
CASES = pytest.mark.parametrize("content, words, has_line", DAMAGE.values(), ids=DAMAGE.keys())


def corrupt_copies(folder: Path, name: str) -> list[Path]:
    return sorted(folder.glob(f"{name}.corrupt-*"))


# -- the shared reader -----------------------------------------------------------------------------------------

@CASES
def test_reader_names_the_file_the_problem_and_where(tmp_path: Path, content: bytes, words: str,
                                                     has_line: bool) -> None:
    path = tmp_path / "some.json"
    path.write_bytes(content)
    with pytest.raises(JsonFileError) as e:
        read_json_file(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and words in msg, msg
    assert (" at line " in msg) == has_line and (e.value.line is not None) == has_line, msg
    msg.encode("utf-8")  # printable: a surrogate in the file never reaches the message
    assert str(pickle.loads(pickle.dumps(e.value))) == msg


def test_reader_accepts_a_bom_and_64_levels(tmp_path: Path) -> None:
    path = tmp_path / "ok.json"
    path.write_bytes(b"\xef\xbb\xbf" + nested(63))  # 63 lists inside the top-level object: 64 levels
    value, depth = read_json_file(path)["x"], 2
    while value:
        value, depth = value[0], depth + 1
    assert depth == 64
    path.write_bytes(nested(64))  # the 64th "[" (column 6 + 64) is the 65th level
    with pytest.raises(JsonFileError, match="line 1, column 70$"):
        read_json_file(path)


def test_reader_counts_brackets_only_outside_strings(tmp_path: Path) -> None:
    path = tmp_path / "ok.json"
    path.write_text(json.dumps({"prompt": "[" * 5000 + '\\" {{{' * 100, "deep": [[["x"]]]}), encoding="utf-8")
    assert read_json_file(path)["deep"] == [[["x"]]]


def test_reader_error_position_is_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b'{\n  "a": 1,\n  "b": "\xc3"\n}')  # a lone lead byte: line 3, column 9
    with pytest.raises(JsonFileError) as e:
        read_json_file(path)
    assert (e.value.line, e.value.column) == (3, 9)


# -- settings.json ---------------------------------------------------------------------------------------------

@CASES
def test_damaged_settings_fall_back_to_defaults_and_are_kept(content: bytes, words: str, has_line: bool,
                                                             caplog) -> None:
    path = paths.settings_file()
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="app.settings"):
        assert load_user_settings() == UserSettings()
    (kept,) = corrupt_copies(path.parent, "settings.json")
    assert kept.read_bytes() == content and not path.exists()
    msg = caplog.text
    assert str(path) in msg and words in msg and str(kept) in msg and "uses its defaults" in msg, msg
    assert (" at line " in msg) == has_line
    assert "Traceback" not in msg
    save_user_settings(UserSettings())  # the next save writes a fresh file next to the kept one
    assert load_user_settings() == UserSettings() and kept.read_bytes() == content


def test_a_save_never_writes_over_a_damaged_settings_file(caplog) -> None:
    path = paths.settings_file()
    save_user_settings(UserSettings(system_prompt="first"))
    path.write_bytes(nested(5000))  # damaged after it was loaded, e.g. by another program
    with caplog.at_level(logging.WARNING, logger="app.settings"):
        save_user_settings(UserSettings(system_prompt="second"))
    (kept,) = corrupt_copies(path.parent, "settings.json")
    assert kept.read_bytes() == nested(5000)
    assert load_user_settings().system_prompt == "second"
    assert str(kept) in caplog.text


def test_two_damaged_settings_files_in_one_second_are_both_kept() -> None:
    path = paths.settings_file()
    for content in (b"{", b"[[["):
        path.write_bytes(content)
        load_user_settings()
    assert sorted(p.read_bytes() for p in corrupt_copies(path.parent, "settings.json")) == [b"[[[", b"{"]


def test_an_unreadable_settings_file_is_left_alone(caplog) -> None:
    path = paths.settings_file()
    path.mkdir()  # a folder where the file should be: cannot be read
    with caplog.at_level(logging.WARNING, logger="app.settings"):
        assert load_user_settings() == UserSettings()
    assert path.is_dir() and not corrupt_copies(path.parent, "settings.json")
    assert "cannot read" in caplog.text


def test_the_cli_runs_with_a_5000_deep_settings_file(tmp_path: Path) -> None:
    home = tmp_path / "cli-home"
    home.mkdir()
    (home / "settings.json").write_bytes(nested(5000))
    env = {**os.environ, "HEARTH_HOME": str(home), "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "app.cli", "remote", "list"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr, r.stderr
    assert "settings.json" in r.stderr and "nested deeper than 64 levels" in r.stderr, r.stderr
    assert "uses its defaults" in r.stderr, r.stderr
    assert corrupt_copies(home, "settings.json")


# -- mcp.json --------------------------------------------------------------------------------------------------

@CASES
def test_damaged_mcp_json_is_a_clear_config_error(tmp_path: Path, content: bytes, words: str,
                                                  has_line: bool) -> None:
    path = tmp_path / "mcp.json"
    path.write_bytes(content)
    with pytest.raises(McpConfigError) as e:  # a HearthError: the window shows it and starts no servers
        load_config(path)
    msg = str(e.value)
    assert isinstance(e.value, HearthError) and e.value.path == str(path)
    assert msg.startswith(f"{path}: ") and words in msg, msg
    assert (" at line " in msg) == has_line, msg
    assert "fix or delete the file" in msg, msg
    assert path.read_bytes() == content, "loading never touches the file"


@pytest.mark.parametrize("content", [b'{"mcpServers": []}', b'{"mcpServers": {"a": {"command": 3}}}'])
def test_wrong_types_in_mcp_json_name_the_file_and_what_to_do(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "mcp.json"
    path.write_bytes(content)
    with pytest.raises(McpConfigError, match=r"mcp\.json: mcpServers.* fix or delete the file"):
        load_config(path)


@pytest.mark.parametrize("content", [nested(5000), b'{"mcpServers": {"a": {"command": 3}}}', b""])
def test_saving_over_a_damaged_mcp_json_keeps_it(tmp_path: Path, content: bytes, caplog) -> None:
    path = tmp_path / "mcp.json"
    path.write_bytes(content)
    cfg = parse_config({"mcpServers": {"fs": {"command": "npx"}}})
    with caplog.at_level(logging.WARNING, logger="app.mcp.config"):
        save_config(path, cfg)
    (kept,) = corrupt_copies(tmp_path, "mcp.json")
    assert kept.read_bytes() == content
    assert load_config(path) == cfg
    assert str(kept) in caplog.text
    save_config(path, McpConfig())  # a sound file is replaced as before, nothing more is set aside
    assert corrupt_copies(tmp_path, "mcp.json") == [kept]


@pytest.mark.gui
@pytest.mark.parametrize("content", [nested(5000), '{"mcpServers": {"caf\u00e9'.encode()[:-1]])
def test_the_window_starts_with_a_damaged_mcp_json(qapp, tmp_path: Path, content: bytes) -> None:
    from app.ui.tools_ctl import ToolsController

    path = tmp_path / "mcp.json"
    path.write_bytes(content)
    ctl = ToolsController(path)  # what `hearth gui` builds at start; it stopped there with a traceback
    try:
        assert ctl.config.servers == () and str(path) in (ctl.config_error or "")
        assert "fix or delete the file" in ctl.config_error
    finally:
        ctl.close()
