"""Bad arguments of the turn commands are refused with one line naming the argument, before any model loads
and before anything is stored (no model needed: each fails first)."""

from __future__ import annotations

import pytest

from app.cli import main
from app.memory import Store


@pytest.mark.parametrize("argv,words", [
    (["chat", "--docs", "--k", "0", "--message", "hi"], "--k must be an integer from 1 to 20"),
    (["chat", "--docs", "--k", "99999", "--message", "hi"], "--k must be an integer from 1 to 20"),
    (["chat", "--conversation", "", "--message", "hi"], "--conversation needs a conversation id"),
    (["chat", "--message", "  "], "the message is empty"),
    (["chat", "--json"], "--json needs --message"),
    (["search", ""], "the search query is empty"),
    (["search", "x", "--k", "0"], "k must be an integer"),
    (["ingest", "--watch", "somewhere", "--interval", "0"], "--interval needs a positive number"),
])
def test_bad_arguments_are_one_line_errors_and_store_nothing(argv, words, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    with Store() as store:
        assert store.list_conversations() == []


def test_version():
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
