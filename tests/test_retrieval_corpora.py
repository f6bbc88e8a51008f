"""The phrase-judged retrieval question sets are sound: every answer phrase occurs exactly once in its corpus,
in the document the question names, and each set is large enough to judge a ranker on (``PHRASE_SETS`` in
``benchmarks/retrieval_corpus.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.retrieval_corpus import PHRASE_SETS, QUESTION_SETS, check_phrases


@pytest.mark.parametrize("name", PHRASE_SETS)
def test_answer_phrases_occur_once_in_their_document(name: str) -> None:
    assert check_phrases(name) == []


@pytest.mark.parametrize("name", PHRASE_SETS)
def test_each_set_has_at_least_30_questions(name: str) -> None:
    assert len(QUESTION_SETS[name].questions) >= 30


def test_every_question_set_on_disk_is_registered() -> None:
    """A ``benchmarks/data/<name>_questions.py`` left out of ``PHRASE_SETS`` would never be benchmarked or
    checked; each one has its ``<name>_docs`` folder of Markdown documents."""
    data = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
    on_disk = {p.name.removesuffix("_questions.py") for p in data.glob("*_questions.py")}
    assert on_disk == set(PHRASE_SETS)
    assert all(any((data / f"{name}_docs").glob("*.md")) for name in on_disk)
