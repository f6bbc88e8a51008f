"""settings.json: atomic, and a bad value never costs the whole file or crashes a command."""

from __future__ import annotations

import argparse
import json

import pytest

from app import paths
from app.cli._engine_args import add_decoding_args, add_load_args, decoding, load_settings
from app.settings import ToolSettings, UserSettings, load_user_settings, save_user_settings


def write(data) -> None:
    paths.settings_file().write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_load_args(p)
    add_decoding_args(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize("data,check", [
    ({"cache_budget_mb": "big"}, lambda s: s.cache_budget_mb == 4096.0),
    ({"server": {"port": "abc"}}, lambda s: s.server.port == 8765),
    ({"server": {"port": 99999}}, lambda s: s.server.port == 8765),
    ({"server": {"max_body_bytes": 0, "port": 9001}},
     lambda s: s.server.max_body_bytes == 16 * 1024 * 1024 and s.server.port == 9001),
    ({"server": {"max_body_bytes": 1 << 20}}, lambda s: s.server.max_body_bytes == 1 << 20),
    ({"system_prompt": 5, "prefix_cache": False}, lambda s: s.system_prompt == "" and s.prefix_cache is False),
    ({"decoding": {"temperature": -3, "top_k": 5}},
     lambda s: s.decoding.temperature == 0.8 and s.decoding.top_k == 5),
    ({"load": {"n_ctx": -5, "type_k": "q8_0"}}, lambda s: s.load.n_ctx == 4096 and s.load.type_k == "q8_0"),
    ({"decoding": {"stop": ["END"], "logit_bias": {"5": -1}}},
     lambda s: s.decoding.stop == ("END",) and s.decoding.logit_bias == ((5, -1.0),)),
    ([1, 2, 3], lambda s: s == UserSettings()),
    ({"tools": {"max_steps": 0, "call_timeout_s": 601, "start_timeout_s": 5}},
     lambda s: s.tools == ToolSettings(max_steps=6, call_timeout_s=60, start_timeout_s=5)),
    ({"tools": {"max_steps": "3", "call_timeout_s": 2.5, "start_timeout_s": True}},
     lambda s: s.tools == ToolSettings()),
    ({"tools": 7, "system_prompt": "hi"}, lambda s: s.tools == ToolSettings() and s.system_prompt == "hi"),
])
def test_bad_values_fall_back_to_defaults_and_keep_the_rest(data, check):
    write(data)
    s = load_user_settings()
    assert check(s)
    if isinstance(data, dict):
        assert paths.settings_file().exists(), "a file with one bad value is not moved aside"


def test_unreadable_file_is_moved_aside():
    write("{bad")
    assert load_user_settings() == UserSettings()
    assert not paths.settings_file().exists()
    assert list(paths.home().glob("settings.json.corrupt-*"))


def test_saved_decoding_and_load_defaults_apply_and_flags_override():
    s = UserSettings()
    from dataclasses import replace

    from app.protocol.types import DecodingParams, LoadSettings

    save_user_settings(replace(s, decoding=DecodingParams.make(temperature=0.0, max_tokens=3, stop=["X"]),
                               load=LoadSettings(n_ctx=1024)))
    d = decoding(parse())
    assert (d.temperature, d.max_tokens, d.stop) == (0.0, 3, ("X",))
    d = decoding(parse("--temperature", "0.5", "--max-tokens", "9"))
    assert (d.temperature, d.max_tokens) == (0.5, 9)
    assert load_settings(parse()).n_ctx == 1024
    assert load_settings(parse("--n-ctx", "2048")).n_ctx == 2048


def test_save_is_atomic_and_round_trips():
    s = load_user_settings()
    save_user_settings(s)
    assert load_user_settings() == s
    assert not list(paths.home().glob(".settings-*.tmp"))


def test_tool_limits_round_trip_and_a_bad_one_is_named_in_a_warning(caplog):
    save_user_settings(UserSettings(tools=ToolSettings(max_steps=20, call_timeout_s=1, start_timeout_s=300)))
    assert json.loads(paths.settings_file().read_text(encoding="utf-8"))["tools"] == {
        "max_steps": 20, "call_timeout_s": 1, "start_timeout_s": 300}
    assert load_user_settings().tools == ToolSettings(20, 1, 300)
    write({"tools": {"max_steps": 21, "call_timeout_s": 30}})
    with caplog.at_level("WARNING", logger="app.settings"):
        assert load_user_settings().tools == ToolSettings(max_steps=6, call_timeout_s=30, start_timeout_s=30)
    assert any("tools.max_steps" in r.getMessage() and "<= 20" in r.getMessage() for r in caplog.records)
