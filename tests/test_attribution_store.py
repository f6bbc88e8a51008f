"""Sentence attributions stored with their answer (migration m008): they survive closing and reopening the
store, travel in the JSON and Markdown exports and back in on import (also as a new conversation), go with
a deleted conversation, and a bad one is refused with the field named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.errors import InvalidRequest
from app.memory import Store
from app.retrieval.attribution import attribute
from app.retrieval.types import Evidence

PASSAGE = Evidence("aaaa11112222", "/docs/ferry.txt", None, 1.0,
                   "The ferry to Lindholm island leaves at 9:15 every morning from pier 4.", 0, 70)
ANSWER = "The ferry to Lindholm leaves at 9:35 every morning. It sails from pier 4."
REASON = "9:35 is not in the passage; it says 9:15"


def _answered(store: Store) -> tuple[str, str]:
    cid = store.create_conversation("ferries")
    uid = store.append_message(cid, "user", "When does the ferry leave?")
    aid = store.append_message(cid, "assistant", ANSWER, uid)
    store.add_attributions(aid, [a.to_dict() for a in attribute(ANSWER, [PASSAGE])])
    return cid, aid


def test_attributions_survive_closing_and_reopening_the_store(tmp_path: Path):
    db = tmp_path / "hearth.db"
    with Store(db) as store:
        cid, aid = _answered(store)
    with Store(db) as store:
        wrong, right = store.attributions_for(aid)
        assert (wrong.supported, wrong.evidence_id, wrong.path) == (False, PASSAGE.evidence_id, PASSAGE.path)
        assert wrong.support["reason"] == REASON and wrong.support["missing"] == ["9:35"]
        assert ANSWER[wrong.sentence_start:wrong.sentence_end].endswith("9:35 every morning.")
        assert right.supported is True and ANSWER[right.sentence_start:right.sentence_end] == "It sails from pier 4."
        assert store.load_conversation(cid).attributions == [wrong, right]
        assert store.get_message(aid).content == ANSWER  # the message row is as it was written


def test_attributions_are_in_the_export_and_come_back_on_import(tmp_path: Path):
    with Store(tmp_path / "a.db") as store:
        cid, aid = _answered(store)
        doc = json.loads(store.export_conversation(cid, "json"))
        md = store.export_conversation(cid, "md")
        kept = store.attributions_for(aid)
    assert [a["support"]["reason"] for a in doc["attributions"]][0] == REASON
    assert all(a["message_id"] == aid for a in doc["attributions"])
    assert f'- ⚠ "The ferry to Lindholm leaves at 9:35 every morning.": {REASON}' in md
    for n, text in enumerate((json.dumps(doc), md)):
        with Store(tmp_path / f"b{n}.db") as other:
            assert other.import_conversation(text) == cid
            assert other.attributions_for(aid) == kept
            new = other.import_conversation(text, as_new=True)
            moved = other.load_conversation(new).attributions
            assert [(a.sentence_start, a.support) for a in moved] == [(a.sentence_start, a.support) for a in kept]
            assert moved[0].message_id != aid


def test_a_deleted_conversation_takes_its_attributions(tmp_path: Path):
    with Store(tmp_path / "hearth.db") as store:
        cid, aid = _answered(store)
        store.delete(cid)
        assert store.attributions_for(aid) == []


def test_a_bad_attribution_is_refused_and_nothing_is_stored(tmp_path: Path):
    with Store(tmp_path / "hearth.db") as store:
        cid, aid = _answered(store)
        before = store.attributions_for(aid)
        good = {"sentence_start": 0, "sentence_end": 5, "supported": None, "support": {}}
        with pytest.raises(InvalidRequest, match="sentence_start <= sentence_end") as err:
            store.add_attributions(aid, [good, {"sentence_start": 9, "sentence_end": 3}])
        assert err.value.param == "sentence_start"
        assert store.attributions_for(aid) == before
        doc = json.loads(store.export_conversation(cid, "json"))
    doc["attributions"][0]["message_id"] = "nope"
    with Store(tmp_path / "c.db") as other, pytest.raises(InvalidRequest, match="attribution names a message"):
        other.import_conversation(doc)


def test_attributions_follow_a_renamed_document_and_stay_when_it_is_gone(tmp_path: Path):
    from types import SimpleNamespace

    with Store(tmp_path / "hearth.db") as store:
        _cid, aid = _answered(store)
        moved = SimpleNamespace(path="/docs/renamed.txt", page=None)
        store.prune_citations(lambda ids: {i: moved for i in ids})
        assert {a.path for a in store.attributions_for(aid)} == {"/docs/renamed.txt"}
        store.prune_citations(lambda ids: {})
        kept = store.attributions_for(aid)
        assert len(kept) == 2 and kept[0].support["reason"] == REASON
