"""Citations stored with answers follow the documents: an edited or deleted file's citations disappear, a
renamed file's citations move to the new path (issue 5), and the messages themselves are untouched."""

from __future__ import annotations

from pathlib import Path

from app.assistant import DocumentSource, citations, prune_stale_citations
from app.assistant.evidence import evidence_text
from app.memory import Store
from app.retrieval.ingest import Ingester
from app.retrieval.store import DocumentStore


def _setup(tmp_path: Path):
    docs_dir = tmp_path / "docs"
    docs_dir.mkdir()
    f = docs_dir / "secret.txt"
    f.write_text("The code word is PELICAN.\n", encoding="utf-8")
    dstore = DocumentStore(tmp_path / "documents.db")
    Ingester(dstore).ingest([str(docs_dir)])
    mem = Store(tmp_path / "hearth.db")
    cid = mem.create_conversation("t")
    uid = mem.append_message(cid, "user", "What is the code word?")
    ctx = DocumentSource(dstore)
    evidence = ctx.search("code word", 4).evidence
    assert evidence and "PELICAN" in evidence[0].text and "[E:" in evidence_text(evidence).block()
    answer = f"It is PELICAN [E:{evidence[0].evidence_id}]."
    aid = mem.append_message(cid, "assistant", answer, uid)
    cites = citations(answer, evidence)
    assert cites and cites[0]["path"] == str(f)
    mem.add_citations(aid, cites)
    return f, docs_dir, dstore, mem, aid, ctx


def test_rename_moves_citation_then_edit_and_delete_remove_it(tmp_path: Path):
    f, docs_dir, dstore, mem, aid, ctx = _setup(tmp_path)
    renamed = docs_dir / "renamed.txt"
    f.rename(renamed)
    Ingester(dstore).rescan()
    assert prune_stale_citations(mem, dstore) == 0
    assert [c.path for c in mem.citations_for(aid)] == [str(renamed)]

    renamed.write_text("The code word is OSPREY.\n", encoding="utf-8")
    Ingester(dstore).rescan()
    assert prune_stale_citations(mem, dstore) == 1
    assert mem.citations_for(aid) == []
    evidence = ctx.search("code word", 4).evidence
    assert [e.text.strip() for e in evidence] == ["The code word is OSPREY."]

    renamed.unlink()
    Ingester(dstore).rescan()
    assert ctx.search("code word", 4).evidence == ()
    assert "PELICAN" in mem.path_to(aid)[-1].content  # the answer itself is never rewritten


def test_deleted_file_citations_disappear(tmp_path: Path):
    f, _docs_dir, dstore, mem, aid, _ctx = _setup(tmp_path)
    f.unlink()
    Ingester(dstore).rescan()
    assert prune_stale_citations(mem, dstore) == 1
    assert mem.citations_for(aid) == []
