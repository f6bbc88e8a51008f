"""The citation check (``app.retrieval.citecheck``) on hand-made supported and unsupported sentences: facts
(numbers, units, dates, codes) without a model, then the whole check with the real embedding model
(all-MiniLM-L6-v2) at ``DEFAULT_THRESHOLD``; and ``supported`` per citation through ``rag.check_citations``
and ``evidence.checked_citations`` (what the window and the API mark)."""

from __future__ import annotations

import pytest

from app.assistant.evidence import CITATION_KEYS, checked_citations
from app.retrieval.citecheck import DEFAULT_THRESHOLD, CitationChecker, facts, missing_facts, spans
from app.retrieval.rag import check_citations, parse_citations
from app.retrieval.types import Evidence

STORAGE = ("How to store\n\nKeep out of the sight and reach of children. Store below 25 °C in the original "
           "package. Do not use after the expiry date printed on the carton after EXP.")
RENT = ("Rent and payment\n\nThe rent is £1,250 per calendar month, payable in advance on the 1st day of each "
        "month by standing order. If rent is more than 14 days late, the tenant must pay interest at 3% above "
        "the Bank of England base rate.")
METEORS = ("Meteor showers\n\nThe Perseids peak around 12–13 August with up to 100 meteors an hour under dark "
           "skies, and the Geminids around 13–14 December. The best rates come after midnight.")
ERRORS = ("Error codes\n\nE15: water has collected in the base tray and the anti-flood protection has switched "
          "on the drain pump. E24: the water is not draining. Check that the drain hose is not kinked.")
KETTLE = ("Keep warm function\n\nHold the TEMP button for two seconds to switch on Keep Warm. The kettle then "
          "holds the water at the selected preset for up to 30 minutes and switches itself off afterwards.")

SUPPORTED = [
    ("Store the tablets below 25 °C.", STORAGE),
    ("Keep them where children cannot see or reach them.", STORAGE),
    ("The rent is £1250 a month, paid in advance.", RENT),
    ("Paying more than 14 days late costs interest at 3% over base rate.", RENT),
    ("The Perseids peak on 12-13 August.", METEORS),
    ("E24 means the dishwasher is not draining the water.", ERRORS),
    ("Keep Warm keeps the water hot for up to 30 minutes.", KETTLE),
]
UNSUPPORTED_FACTS = [  # a number, unit, date or code that the passage does not have
    ("Store the tablets below 30 °C.", STORAGE, "30 °C"),
    ("Store the tablets below 25 °F.", STORAGE, "25 °F"),
    ("The rent is £1,350 a month.", RENT, "£1,350"),
    ("The rent is $1,250 a month.", RENT, "$1,250"),
    ("The Perseids peak around 12 September.", METEORS, "September"),
    ("E25 means the water is not draining.", ERRORS, "E25"),
    ("Keep Warm lasts up to 30 hours.", KETTLE, "30 hours"),
]
UNSUPPORTED_MEANING = [  # no fact to miss, and the passage is about something else
    # (a claim on the passage's own topic that it does not make, e.g. "you need a telescope to see meteor
    # showers", can pass: docs/retrieval.md "Citation check", kind "unstated")
    ("Paracetamol relieves headache, toothache and the aches of flu.", STORAGE),
    ("The landlord pays for the tenant's broadband.", RENT),
    ("Use a red torch to keep your eyes adapted to the dark.", METEORS),  # true elsewhere, not in this passage
    ("The kettle can be controlled from a phone app.", KETTLE),
]


def test_facts_are_numbers_with_units_dates_and_codes():
    got = [(f.kind, f.value, f.unit, f.currency) for f in facts("E24 at 1,250 °C, £45 on 12 Aug [E:0123abcd]")]
    assert got == [("code", "e24", None, None), ("number", "1250", "°c", None), ("number", "45", None, "£"),
                   ("number", "12", None, None), ("date", "aug", None, None)]
    assert facts("It may rain.") == []  # "may" the verb is not a month


@pytest.mark.parametrize("sentence,passage", SUPPORTED)
def test_supported_sentences_miss_no_fact(sentence, passage):
    assert missing_facts(sentence, passage) == []


@pytest.mark.parametrize("sentence,passage,missing", UNSUPPORTED_FACTS)
def test_a_changed_number_unit_date_or_code_is_missing(sentence, passage, missing):
    assert missing_facts(sentence, passage) == [missing]
    check = CitationChecker(None).check(sentence, passage)
    assert not check.supported and check.missing == (missing,) and missing in check.reason
    assert check.similarity is None and check.threshold is None


def test_spans_are_sentences_and_adjacent_pairs():
    assert spans("# Head\n\nOne. Two! Three?") == ["Head", "One.", "Two!", "Three?", "Head One.", "One. Two!",
                                                   "Two! Three?"]


def _evidence(text: str, eid: str = "0123456789ab") -> Evidence:
    return Evidence(eid, "/docs/leaflet.md", None, 1.0, text, 0, len(text))


def test_each_citation_gets_its_own_verdict_and_sentence_span():
    good, bad = _evidence(STORAGE, "aaaaaaaaaaaa"), _evidence(RENT, "bbbbbbbbbbbb")
    answer = "Store below 25 °C [E:aaaaaaaaaaaa]. The rent is £990 a month [E:bbbbbbbbbbbb]. No claim here."
    cites = check_citations(answer, parse_citations(answer, [good, bad]), [good, bad])
    assert [c.supported for c in cites] == [True, False]
    assert answer[cites[0].sentence_start:cites[0].sentence_end].strip() == "Store below 25 °C"
    assert answer[cites[1].sentence_start:cites[1].sentence_end].strip() == "The rent is £990 a month"
    assert cites[1].support["missing"] == ["£990"]
    dicts = checked_citations(answer, [good, bad])
    assert [d["supported"] for d in dicts] == [True, False]
    assert set(CITATION_KEYS) | {"supported", "sentence_start", "sentence_end", "support"} == set(dicts[0])


def test_a_failing_embedding_call_falls_back_to_the_facts_check():
    def crashed(texts):
        raise RuntimeError("the embedding process died")

    good, bad = _evidence(STORAGE, "aaaaaaaaaaaa"), _evidence(RENT, "bbbbbbbbbbbb")
    answer = "Store below 25 °C [E:aaaaaaaaaaaa]. The rent is £990 a month [E:bbbbbbbbbbbb]."
    dicts = checked_citations(answer, [good, bad], CitationChecker(crashed))
    assert [d["supported"] for d in dicts] == [True, False]
    assert [d["support"]["similarity"] for d in dicts] == [None, None]


def test_a_marker_after_the_full_stop_checks_the_sentence_before_it():
    ev = _evidence(STORAGE)
    answer = "It is fine. Store it below 30 °C. [E:0123456789ab]"
    (c,) = check_citations(answer, parse_citations(answer, [ev]), [ev])
    assert "30 °C" in answer[c.sentence_start:c.sentence_end] and not c.supported


@pytest.mark.model
def test_the_whole_check_with_embeddings_on_hand_made_sentences(embedding_model):
    from app.retrieval.embedder import Embedder

    with Embedder(embedding_model) as embedder:
        checker = CitationChecker(embedder.embed)
        ok = checker.check_many(SUPPORTED)
        bad = checker.check_many([(s, p) for s, p, _ in UNSUPPORTED_FACTS] + UNSUPPORTED_MEANING)
    assert all(c.supported for c in ok), [(s, c.similarity) for (s, _), c in zip(SUPPORTED, ok) if not c.supported]
    assert not any(c.supported for c in bad), [(i, c) for i, c in enumerate(bad) if c.supported]
    assert all(c.threshold == DEFAULT_THRESHOLD for c in ok)
    meaning = bad[len(UNSUPPORTED_FACTS):]
    assert all(not c.missing and c.similarity < DEFAULT_THRESHOLD for c in meaning)  # caught by similarity


def test_adjacent_markers_cite_the_same_sentence():
    a, b = _evidence(STORAGE, "aaaaaaaaaaaa"), _evidence(RENT, "bbbbbbbbbbbb")
    answer = "Intro. Store below 25 °C [E:aaaaaaaaaaaa] [E:bbbbbbbbbbbb]."
    cites = check_citations(answer, parse_citations(answer, [a, b]), [a, b])
    spans = {answer[c.sentence_start:c.sentence_end].split("[")[0].strip() for c in cites}
    assert spans == {"Store below 25 °C"} and [c.supported for c in cites] == [True, False]


def test_break_it_signs_marker_first_stacked_markers_and_a_bare_marker():
    from app.assistant.evidence import checked_citations
    from app.retrieval.citecheck import missing_facts
    from app.retrieval.rag import parse_citations
    from app.retrieval.types import Evidence

    assert missing_facts("Freeze at −18 °C.", "Freeze at 18 °C.") == ["-18 °C"]
    assert missing_facts("It is 18 °C.", "It is -18 °C.") == ["18 °C"]
    assert missing_facts("Freeze at -18 °C.", "Freeze at −18 °C.") == []
    assert missing_facts("Use 5-10 g, dated 2024-03-05.", "Use 5-10 g of tea (2024-03-05).") == []  # not signs
    a = Evidence("a1b2c3d4e5f6", "/a", None, 1, "X is PELICAN.", 0, 13)
    b = Evidence("0f0e0d0c0b0a", "/b", None, 1, "Y.", 0, 2)
    s = "X is PELICAN [E:a1b2c3d4e5f6] [E:0f0e0d0c0b0a]."
    assert [s[c.sentence_start:c.sentence_end] for c in parse_citations(s, [a, b])] == ["X is PELICAN "] * 2
    first = checked_citations("[E:a1b2c3d4e5f6] X is 99 kg.", [a])  # the marker opens its sentence
    assert (first[0]["sentence_start"], first[0]["sentence_end"], first[0]["supported"]) == (17, 28, False)
    bare = checked_citations("[E:a1b2c3d4e5f6]", [a])
    assert bare[0]["supported"] is False and "no sentence" in bare[0]["support"]["reason"]


@pytest.mark.parametrize("sentence, missing", [
    ("The backup runs at 30:02.", ["30:02"]),  # the parts 30 and 02 are in the passage, the time is not
    ("The office closes at 17:02.", ["17:02"]),
    ("It runs at 2:30 and the office closes at 17:00.", []),  # 02:30 written without its leading zero
    ("The combination is 4-17-31.", ["4-17-31"]),
    ("The combination is 31-17-4.", []),
    ("Release 3.2.1 shipped on 2024-05-03.", []),
    ("Release 3.1.2 shipped on 2024-03-05.", ["3.1.2", "2024-03-05"]),
    ("Boil for 5-10 minutes.", []),  # a two-number range stays two numbers
])
def test_times_dates_versions_and_combinations_are_checked_whole(sentence, missing):
    passage = ("The backup runs every night at 02:30. The München office closes at 17:00. Release 3.2.1 shipped "
               "on 2024-05-03. The safe's combination is 31-17-4. Boil for 5 to 10 minutes.")
    assert missing_facts(sentence, passage) == missing


@pytest.mark.parametrize("sentence, passage, missing", [
    ("The ferry costs 12 dollars.", "The ferry costs 12 euros.", ["12 dollars"]),
    ("The ferry costs 12 USD.", "The ferry costs 12 EUR.", ["12 USD"]),
    ("It costs GBP 40.", "It costs €40.", ["GBP 40"]),
    ("It costs 40 pounds.", "It costs $40.", ["40 pounds"]),
    ("It closes in May.", "The shop closes in March.", ["May"]),
    ("It opens on 3 May.", "It opens on 3 June.", ["May"]),
    ("It opens May 3rd.", "It opens June 3rd.", ["May"]),
    ("The ferry runs on Sundays.", "The ferry runs on Mondays.", ["Sundays"]),
])
def test_a_wrong_currency_or_month_or_plural_weekday_is_missing(sentence, passage, missing):
    assert missing_facts(sentence, passage) == missing


def test_currencies_are_one_sign_however_written_and_may_is_a_month_only_where_one_is_expected():
    assert {(f.value, f.unit, f.currency) for text in ("€12", "12 €", "12 euros", "12 EUR", "EUR 12", "12 euro")
            for f in facts(text)} == {("12", None, "€")}
    assert missing_facts("The ferry costs 12 EUR.", "Tickets: €12 for adults.") == []
    assert missing_facts("It costs 12 euros.", "It costs 12.") == ["12 euros"]  # as for "£12": the sign too
    assert [f.value for f in facts("It closes in May, by May or after May 5.")] == ["5", "may", "may", "may"]
    assert facts("You may book a seat. May I help?") == []
    assert missing_facts("It closes in May.", "Closed from May to June.") == []
    assert [(f.kind, f.value) for f in facts("on Mondays")] == [("date", "monday")]
    assert missing_facts("It runs on Monday.", "It runs on Mondays.") == []
    assert missing_facts("It runs on Mondays.", "It runs every Monday.") == []
