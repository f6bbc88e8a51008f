"""``hearth.attributions`` on the port (the shared fake engine, the real attribution check without
embeddings): an answer that cites nothing still has its wrong time flagged against the passage it was given,
beside ``hearth.citations``, in the whole body and on a stream's final chunk alike; without documents the
field is absent."""

from __future__ import annotations

from app.retrieval.types import Evidence
from tests.fakes import FakeEngine
from tests.test_server_fake import FakeDocs, client, events

FERRY = Evidence("aaaa11112222", "/docs/ferry.txt", None, 1.0,
                 "The ferry to Lindholm island leaves at 7:45 every morning from pier 4.", 0, 72)
ANSWER = "Hello! The ferry to Lindholm island leaves at 9:35 every morning. It goes from pier 4."
QUESTION = [{"role": "user", "content": "When does the ferry leave?"}]


def test_an_uncited_wrong_time_is_flagged_in_hearth_attributions_whole_and_streamed():
    eng = FakeEngine(n_ctx=4096, reply=lambda req: ANSWER)
    c = client(eng, documents=FakeDocs(passages=(FERRY,)))
    whole = c.post("/v1/chat/completions", json={"messages": QUESTION, "hearth": {"documents": True}}).json()
    h = whole["hearth"]
    assert h["citations"] == [] and [e["evidence_id"] for e in h["evidence"]] == [FERRY.evidence_id]
    wrong, right = h["attributions"]  # "Hello!" makes no claim: skipped
    content = whole["choices"][0]["message"]["content"]
    assert content[wrong["sentence_start"]:wrong["sentence_end"]] == \
        "The ferry to Lindholm island leaves at 9:35 every morning."
    assert (wrong["supported"], wrong["evidence_id"], wrong["path"]) == (False, FERRY.evidence_id, FERRY.path)
    assert wrong["support"]["reason"] == "9:35 is not in the passage; it says 7:45"
    assert wrong["support"]["missing"] == ["9:35"] and wrong["support"]["similarity"] is None
    assert right["supported"] is True and content[right["sentence_start"]:right["sentence_end"]] == \
        "It goes from pier 4."
    ev = events(c.post("/v1/chat/completions", json={"messages": QUESTION, "stream": True,
                                                     "hearth": {"documents": True}}).content)
    assert all("hearth" not in e for e in ev[:-1]) and ev[-1]["hearth"]["attributions"] == h["attributions"]
    plain = c.post("/v1/chat/completions", json={"messages": QUESTION}).json()
    assert "attributions" not in plain["hearth"]
