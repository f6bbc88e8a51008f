"""Summaries, citations and attributions in the conversation store, as a mixin of ``Store``: records about
messages, kept in their own tables so that the message rows are never rewritten for them (docs/memory.md
"Store")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Callable

from app.errors import InvalidRequest
from app.memory.records import Attribution, Citation, Summary, dumps_json, loads_json, now, summary_id

INSERT_CITATION = ("INSERT INTO citations (message_id, evidence_id, path, page, quote, supported, sentence_start, "
                   "sentence_end, support) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")


def citation_values(d: dict) -> list[Any]:
    """A citation dict's column values after ``message_id`` (``INSERT_CITATION``); the check's columns NULL
    when it has no ``supported`` (not checked)."""
    page, supported = d.get("page"), d.get("supported")
    checked = supported is not None
    span = [d.get("sentence_start"), d.get("sentence_end")] if checked else [None, None]
    return [str(d["evidence_id"]), d.get("path"), None if page is None else int(page), d.get("quote"),
            int(bool(supported)) if checked else None, *(None if v is None else int(v) for v in span),
            dumps_json(d.get("support")) if checked else None]


INSERT_ATTRIBUTION = ("INSERT INTO attributions (message_id, sentence_start, sentence_end, evidence_id, path, page, "
                      "supported, support) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")


def attribution_values(d: dict) -> list[Any]:
    """An attribution dict's column values after ``message_id`` (``INSERT_ATTRIBUTION``). ``InvalidRequest``
    for a sentence span that is not two integers ``0 <= start <= end``."""
    start, end = d.get("sentence_start"), d.get("sentence_end")
    if not (isinstance(start, int) and isinstance(end, int)) or isinstance(start, bool) or isinstance(end, bool) \
            or not 0 <= start <= end:
        raise InvalidRequest(f"an attribution needs sentence_start <= sentence_end as integers >= 0, got "
                             f"{start!r}, {end!r}", param="sentence_start")
    page, supported = d.get("page"), d.get("supported")
    return [start, end, d.get("evidence_id"), d.get("path"), None if page is None else int(page),
            None if supported is None else int(bool(supported)), dumps_json(d.get("support"))]


def _attribution_from_row(r: dict, warnings: list[str] | None) -> Attribution:
    support = loads_json(r["support"], f"attribution {r['id']}: support", warnings)
    return Attribution(r["message_id"], r["sentence_start"], r["sentence_end"], r["evidence_id"], r["path"],
                       r["page"], None if r["supported"] is None else bool(r["supported"]), support)


def _renamed(rows: list[dict], found: dict[str, Any]) -> list[tuple[Any, Any, int]]:
    """``(path, page, row id)`` for each row (``id``, ``evidence_id``, ``path``, ``page``) whose evidence
    ``found`` (``resolve``'s answer) places at another path or page: a renamed document."""
    out = []
    for r in rows:
        hit = found.get(r["evidence_id"])
        if hit is not None and (hit.path, hit.page) != (r["path"], r["page"]):
            out.append((hit.path, hit.page, r["id"]))
    return out


def _citation_from_row(r: dict, warnings: list[str] | None) -> Citation:
    """A ``citations`` row as a ``Citation``: ``supported`` None for a row never checked (before m007)."""
    checked = r["supported"] is not None
    support = loads_json(r["support"], f"citation {r['id']}: support", warnings) if checked else None
    return Citation(r["message_id"], r["evidence_id"], r["path"], r["page"], r["quote"],
                    bool(r["supported"]) if checked else None, r["sentence_start"], r["sentence_end"], support)


class SummariesCitations:
    """Summary, citation and attribution rows of a conversation's messages (mixed into ``Store``)."""

    # provided by Store
    _tx: Any
    _rows: Any
    _require_message: Any
    path_to: Any

    def add_summary(self, conversation_id: str, text: str, first_message_id: str, last_message_id: str,
                    model: str = "", settings: dict | None = None) -> str:
        """Store a summary of the branch segment ``first_message_id`` .. ``last_message_id`` (inclusive; the
        first must be on the path to the last). Returns its id (a content hash: adding it twice is a no-op)."""
        self._require_message(last_message_id, conversation_id)
        self._require_message(first_message_id, conversation_id)
        if first_message_id not in {m.id for m in self.path_to(last_message_id)}:
            raise InvalidRequest(f"summary range: {first_message_id!r} is not on the path to {last_message_id!r}",
                                 param="first_message_id")
        sid = summary_id(conversation_id, first_message_id, last_message_id, text)
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO summaries (id, conversation_id, text, first_message_id, "
                       "last_message_id, model, settings, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       [sid, conversation_id, text, first_message_id, last_message_id, model, dumps_json(settings),
                        now()])
        return sid

    def _summary_from_row(self, row: dict, warnings: list[str] | None = None) -> Summary:
        return Summary(id=row["id"], conversation_id=row["conversation_id"], text=row["text"] or "",
                       first_message_id=row["first_message_id"], last_message_id=row["last_message_id"],
                       model=row["model"] or "", created=row["created"],
                       settings=loads_json(row["settings"], f"summary {row['id']}: settings", warnings))

    def summaries_for(self, conversation_id: str, warnings: list[str] | None = None) -> list[Summary]:
        """All summaries of a conversation (every branch), oldest first."""
        rows = self._rows("SELECT * FROM summaries WHERE conversation_id = ? ORDER BY created, rowid",
                          [conversation_id])
        return [self._summary_from_row(r, warnings) for r in rows]

    def add_citations(self, message_id: str, citations: Iterable[Citation | dict]) -> None:
        """Link ``message_id`` to retrieval evidence. Items: ``Citation`` or dicts with evidence_id, path,
        page, quote and, when checked, ``supported``, ``sentence_start``, ``sentence_end``, ``support``
        (``app.assistant.evidence.checked_citations``; ``message_id`` in them is ignored)."""
        self._require_message(message_id)
        rows = []
        for c in citations:
            d = c.to_dict() if isinstance(c, Citation) else dict(c)
            if d.get("evidence_id") is None:
                raise InvalidRequest("a citation needs an evidence_id", param="evidence_id")
            rows.append([message_id, *citation_values(d)])
        with self._tx() as db:
            for r in rows:
                db.execute(INSERT_CITATION, r)

    def prune_citations(self, resolve: Callable[[list[str]], dict[str, Any]]) -> int:
        """Drop citations whose evidence no longer exists, and move the rest to their document's current path.

        ``resolve(evidence_ids) -> {evidence_id: obj with .path and .page}`` (the document index's
        ``DocumentStore.resolve``; passed in so that memory does not import retrieval). A deleted or edited
        document's evidence IDs stop resolving, so its citations disappear; a renamed one keeps them under the
        new path. Returns the number of citations removed. Messages themselves are never touched. Attributions
        follow a renamed document's path too, and are kept when their evidence is gone (they record what the
        answer was given)."""
        self._move_attributions(resolve)
        rows = self._rows("SELECT id, evidence_id, path, page FROM citations", [])
        if not rows:
            return 0
        found = resolve(sorted({r["evidence_id"] for r in rows}))
        gone = [r["id"] for r in rows if r["evidence_id"] not in found]
        moved = _renamed(rows, found)
        with self._tx() as db:
            for cid in gone:
                db.execute("DELETE FROM citations WHERE id = ?", [cid])
            for path, page, cid in moved:
                db.execute("UPDATE citations SET path = ?, page = ? WHERE id = ?", [path, page, cid])
        return len(gone)

    def _move_attributions(self, resolve: Callable[[list[str]], dict[str, Any]]) -> None:
        rows = self._rows("SELECT id, evidence_id, path, page FROM attributions WHERE evidence_id IS NOT NULL", [])
        found = resolve(sorted({r["evidence_id"] for r in rows})) if rows else {}
        moved = _renamed(rows, found)
        if moved:
            with self._tx() as db:
                for path, page, aid in moved:
                    db.execute("UPDATE attributions SET path = ?, page = ? WHERE id = ?", [path, page, aid])

    def citations_for(self, message_id: str, warnings: list[str] | None = None) -> list[Citation]:
        """The citations of ``message_id`` in the order stored (answer order), with their check when they
        were checked (``Citation``)."""
        rows = self._rows("SELECT * FROM citations WHERE message_id = ? ORDER BY id", [message_id])
        return [_citation_from_row(r, warnings) for r in rows]

    def _citations_of(self, conversation_id: str, warnings: list[str] | None = None) -> list[Citation]:
        rows = self._rows("SELECT c.* FROM citations c JOIN messages m ON m.id = c.message_id "
                          "WHERE m.conversation_id = ? ORDER BY m.seq, c.id", [conversation_id])
        return [_citation_from_row(r, warnings) for r in rows]

    def add_attributions(self, message_id: str, attributions: Iterable[Attribution | dict]) -> None:
        """Store the sentence attribution of ``message_id`` (``app.retrieval.attribution``): items are
        ``Attribution`` or dicts with ``sentence_start``, ``sentence_end``, ``evidence_id`` / ``path`` / ``page``
        (None: attributed to none), ``supported`` and ``support`` (``SentenceAttribution.to_dict()``;
        ``message_id`` in them is ignored). ``InvalidRequest`` for a bad span; nothing is stored then."""
        self._require_message(message_id)
        rows = [[message_id, *attribution_values(a.to_dict() if isinstance(a, Attribution) else dict(a))]
                for a in attributions]
        with self._tx() as db:
            for r in rows:
                db.execute(INSERT_ATTRIBUTION, r)

    def attributions_for(self, message_id: str, warnings: list[str] | None = None) -> list[Attribution]:
        """The attributions of ``message_id`` in answer order ([] for an answer that had no evidence, or that
        was stored before m008)."""
        rows = self._rows("SELECT * FROM attributions WHERE message_id = ? ORDER BY id", [message_id])
        return [_attribution_from_row(r, warnings) for r in rows]

    def _attributions_of(self, conversation_id: str, warnings: list[str] | None = None) -> list[Attribution]:
        rows = self._rows("SELECT a.* FROM attributions a JOIN messages m ON m.id = a.message_id "
                          "WHERE m.conversation_id = ? ORDER BY m.seq, a.id", [conversation_id])
        return [_attribution_from_row(r, warnings) for r in rows]
