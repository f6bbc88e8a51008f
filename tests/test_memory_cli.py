"""``hearth history``: list, show, search, export, import, each with --json (store in HEARTH_HOME)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from app.cli import history
from app.memory.store import Store


def hearth(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="hearth")
    history.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr().out


@pytest.fixture
def conversation() -> str:
    with Store() as store:
        cid = store.create_conversation("Oslo trip")
        u = store.append_message(cid, "user", "Plan 3 days in Oslo for 500 euros", None)
        a = store.append_message(cid, "assistant", "Day 1: the Munch museum.", u)
        store.add_summary(cid, "Oslo, 3 days, 500 euros.", u, a, model="fake")
    return cid


def test_list_show_search(conversation: str, capsys: pytest.CaptureFixture) -> None:
    code, out = hearth(["history", "list", "--json"], capsys)
    assert code == 0 and json.loads(out)["conversations"][0]["id"] == conversation
    code, out = hearth(["history", "list"], capsys)
    assert "Oslo trip" in out and conversation[:12] in out
    code, out = hearth(["history", "show", conversation[:8], "--json"], capsys)
    shown = json.loads(out)
    assert [(m["role"], m["status"]) for m in shown["messages"]] == [("user", "complete"), ("assistant", "complete")]
    assert shown["messages"][0]["content"].startswith("Plan 3 days")
    s = shown["summaries"][0]
    assert (s["text"], s["first_message_id"], s["last_message_id"]) == (
        "Oslo, 3 days, 500 euros.", shown["messages"][0]["id"], shown["messages"][1]["id"])
    code, out = hearth(["history", "show", conversation], capsys)
    assert "Munch museum" in out and "summary of" in out
    code, out = hearth(["history", "search", "museum", "--json"], capsys)
    assert [r["role"] for r in json.loads(out)["results"]] == ["assistant"]
    code, out = hearth(["history", "search", 'NEAR("'], capsys)
    assert code == 0 and "no matches" in out


@pytest.mark.parametrize("fmt", ["json", "md"])
def test_export_import_round_trip(conversation: str, capsys: pytest.CaptureFixture, tmp_path: Path,
                                  fmt: str) -> None:
    out_file = tmp_path / f"conv.{fmt}"
    code, out = hearth(["history", "export", conversation, "--format", fmt, "--output", str(out_file), "--json"],
                       capsys)
    assert code == 0 and json.loads(out)["format"] == fmt
    with Store() as store:
        before = store.export_conversation(conversation, "json")
        store.delete(conversation)
    code, out = hearth(["history", "import", str(out_file), "--json"], capsys)
    assert code == 0 and json.loads(out) == {"conversation_id": conversation, "messages": 2, "summaries": 1,
                                             "citations": 0}
    with Store() as store:
        assert store.export_conversation(conversation, "json") == before
    code, out = hearth(["history", "import", str(out_file), "--as-new"], capsys)
    assert code == 0 and out.startswith("imported ")
