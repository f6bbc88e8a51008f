"""Sentence attribution (``app.retrieval.attribution``): an answer that cites nothing still has each claim
tied to the passage given that supports it, its facts checked, and a wrong one explained the way a person
reads it. Pure logic: word overlap (no embedder) and a scripted embedder for the similarity path."""

from __future__ import annotations

import numpy as np
import pytest

from app.retrieval.attribution import attribute, explain, is_claim
from app.retrieval.citecheck import CitationChecker, sentence_spans
from app.retrieval.types import Evidence

FERRY = Evidence("aaaa11112222", "/docs/ferry.txt", None, 1.0,
                 "Ferry timetable. The ferry to Lindholm island leaves at 9:15 every morning from pier 4. "
                 "The last crossing of the season is on 2024-10-27. Tickets cost £12 for adults. "
                 "The crossing takes 45 minutes.", 0, 200)
KITCHEN = Evidence("bbbb11112222", "/docs/kitchen.txt", 2, 1.0,
                   "Bake the bread at 220 °C for 30 minutes. Let it cool on a rack before slicing.", 0, 80)
GIVEN = [FERRY, KITCHEN]


def only(answer: str, passages=GIVEN, checker=None):
    out = attribute(answer, passages, checker)
    assert len(out) == 1, out
    return out[0]


@pytest.mark.parametrize("answer, wrong, right, eid", [
    ("The ferry to Lindholm leaves at 9:35 every morning from pier 4.", "9:35", "9:15", FERRY.evidence_id),
    ("The last crossing of the season is on 2024-11-27.", "2024-11-27", "2024-10-27", FERRY.evidence_id),
    ("Tickets for adults cost £14.", "£14", "£12", FERRY.evidence_id),
    ("Bake the bread at 220 °F for 30 minutes.", "220 °F", "220 °C", KITCHEN.evidence_id),
])
def test_a_wrong_time_date_number_and_unit_are_flagged_against_the_passage_with_the_reason(answer, wrong, right,
                                                                                         eid):
    a = only(answer)
    assert a.supported is False and a.evidence_id == eid
    assert a.missing == (wrong,)
    assert a.reason == f"{wrong} is not in the passage; it says {right}"
    assert answer[a.sentence_start:a.sentence_end] == answer.rstrip(".") + "."


def test_a_correct_paraphrase_is_not_flagged():
    a = only("Every morning at a quarter past nine, that is 9:15, the boat for Lindholm sails from pier 4.")
    assert a.supported is True and a.evidence_id == FERRY.evidence_id and a.missing == ()
    b = only("Let the loaf cool on a rack, and only then slice it.")
    assert b.supported is True and b.evidence_id == KITCHEN.evidence_id
    assert (b.path, b.page) == ("/docs/kitchen.txt", 2)


def test_sentences_that_make_no_claim_are_skipped():
    answer = ("Sure! Do you want the return times too? The crossing takes 50 minutes. I hope this helps. "
              "See above.")
    out = attribute(answer, GIVEN)
    assert [answer[a.sentence_start:a.sentence_end] for a in out] == ["The crossing takes 50 minutes."]
    assert out[0].reason == "50 minutes is not in the passage; it says 45 minutes"
    for text in ("Sure!", "Is that all?", "Thanks, glad to help.", "See above.", "   "):
        assert not is_claim(text), text
    assert is_claim("At 9:35.")  # short, but it states a time


def test_a_bare_fact_is_checked_against_the_passage_that_has_one_of_its_kind():
    a = only("At 9:35.")
    assert a.evidence_id == FERRY.evidence_id and a.reason == "9:35 is not in the passage; it says 9:15"


def test_a_sentence_about_no_passage_is_attributed_to_none_and_flagged_only_with_a_fact():
    out = attribute("Volcanoes erupt molten rock from deep underground. Mount Etna is 3357 metres high.", GIVEN)
    assert [(a.evidence_id, a.supported) for a in out] == [(None, None), (None, False)]
    assert out[1].reason == "3357 metres is in none of the passages given"


def test_no_evidence_or_no_claim_gives_nothing():
    assert attribute("The ferry leaves at 9:35.", []) == []
    assert attribute("Hello!", GIVEN) == []


def test_explain_names_each_missing_fact_and_the_passage_fact_nearest_its_context():
    passage = "The bus leaves at 8:05. The ferry leaves at 9:15 and returns at 17:30."
    assert explain("The ferry leaves at 9:35 and returns at 17:30.", passage, ["9:35"]) == \
        "9:35 is not in the passage; it says 9:15"
    assert explain("It costs $40.", passage, ["$40"]) == "$40 is not in the passage"


def test_the_most_similar_passage_wins_and_facts_break_a_tie():
    def embed(texts):  # ferry words point one way, kitchen words another
        rows = [[1.0, 0.0] if ("ferry" in t.lower() or "crossing" in t.lower() or "ticket" in t.lower())
                else [0.0, 1.0] for t in texts]
        return np.asarray(rows, dtype=np.float32)

    checker = CitationChecker(embed)
    a = only("The ferry crossing takes 50 minutes.", checker=checker)
    assert a.evidence_id == FERRY.evidence_id and a.similarity == pytest.approx(1.0)
    assert a.reason == "50 minutes is not in the passage; it says 45 minutes"
    assert a.to_dict()["support"]["threshold"] is not None and a.to_dict()["support"]["reason"] == a.reason

    def broken(_texts):
        raise RuntimeError("embedding process died")

    b = only("The ferry crossing takes 50 minutes.", checker=CitationChecker(broken))
    assert b.evidence_id == FERRY.evidence_id and b.similarity is None  # word overlap instead


def test_sentence_spans_split_as_the_citation_check_does():
    text = "First one. Second: 9.15 is a number!\n- a list item\n\n  Last"
    assert [text[a:b] for a, b in sentence_spans(text)] == ["First one.", "Second: 9.15 is a number!",
                                                            "- a list item", "Last"]


def test_the_check_does_not_use_the_search_embedder_when_it_is_not_minilm(doc_store):
    from app.assistant.evidence import DocumentSource
    from tests.fakes import FakeEmbedder

    # The bars were chosen on all-MiniLM-L6-v2: another model's cosines mean nothing against them. Without
    # MiniLM installed (this test's HEARTH_HOME), the check falls back to facts and word overlap.
    docs = DocumentSource(doc_store, FakeEmbedder())
    try:
        checker = docs.checker()
        assert checker.embed is None and docs.checker() is checker
        off = attribute("Bananas are a yellow fruit rich in potassium.", GIVEN, checker)
        assert [(a.evidence_id, a.supported) for a in off] == [(None, None)]
    finally:
        docs.close()


FERRY_ONLY = Evidence("cccc11112222", "/docs/ferry2.txt", None, 1.0,
                      "The ferry leaves the harbour at 9:15 and costs 12 euros.", 0, 60)
BUS = Evidence("dddd11112222", "/docs/bus.txt", None, 1.0,
               "The bus to the airport leaves at 10:40 and costs 3 euros. It runs every 20 minutes.", 0, 90)


def test_the_subject_decides_the_passage_before_a_fact_another_passage_happens_to_hold():
    def embed(texts):  # both passages equally close: the sentence is too short to tell them apart by meaning
        return np.asarray([[1.0, 0.0]] * len(texts), dtype=np.float32)

    for checker in (None, CitationChecker(embed)):
        a = only("The ferry leaves at 10:40.", [FERRY_ONLY, BUS], checker)
        assert (a.evidence_id, a.supported) == (FERRY_ONLY.evidence_id, False), a
        assert a.reason == "10:40 is not in the passage; it says 9:15"
        b = only("It leaves at 10:40.", [FERRY_ONLY, BUS], checker)  # no subject to tell: the facts decide
        assert (b.evidence_id, b.supported) == (BUS.evidence_id, True)
    c = only("The ferry to the island leaves from the harbour at 10:40.", [FERRY_ONLY, BUS])
    assert (c.evidence_id, c.reason) == (FERRY_ONLY.evidence_id, "10:40 is not in the passage; it says 9:15")


@pytest.mark.parametrize("answer, reason", [
    ("The ferry leaves at 9.15.", "9.15 is not in the passage; it says 9:15"),
    ("The ferry costs 12 dollars.", "12 dollars is not in the passage; it says 12 euros"),
    ("The ferry costs €15.", "€15 is not in the passage; it says 12 euros"),
])
def test_it_says_names_the_fact_the_claim_misstates(answer, reason):
    a = only(answer, [FERRY_ONLY])
    assert (a.supported, a.reason) == (False, reason)
    assert only("It closes in May.", [Evidence("e" * 12, "/docs/shop.txt", None, 1.0, "The shop closes in March.",
                                               0, 30)]).reason == "May is not in the passage; it says March"


def test_a_supported_reason_never_reads_as_below_the_bar():
    def embed(texts):  # the bare answer is far from the passage in meaning, as " 9:15." is
        return np.asarray([[1.0, 0.0] if t.strip(" .") == "9:15" else [0.0, 1.0] for t in texts], dtype=np.float32)

    a = only(" 9:15.", [FERRY_ONLY], CitationChecker(embed))
    assert a.supported is True and a.similarity == pytest.approx(0.0)
    assert a.reason == "supported by its facts: 9:15 is in the passage (similarity 0.00, under the 0.40 bar " \
                       "for meaning alone)"
    same = CitationChecker(lambda texts: np.asarray([[1.0, 0.0]] * len(texts), dtype=np.float32))
    b = only("The ferry leaves the harbour at 9:15.", [FERRY_ONLY], same)
    assert b.supported is True and b.reason == "supported by the passage (similarity 1.00 ≥ 0.40)"
