"""What Hearth's MCP tools do, without MCP: the person's documents and conversations read through the core,
``ask`` answered by the local model from the documents with its citations checked, and ``ingest`` (a write,
off unless allowed). Plain blocking methods that return JSON-ready dicts and raise ``HearthError`` subclasses
naming the bad parameter; ``app.server.mcp_server`` turns them into MCP tools and tool errors.

The reasoning: docs/mcp.md, 'Hearth as an MCP server'.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from app.assistant import Caller, given, ground
from app.assistant.evidence import MAX_K, check_k
from app.errors import HearthError, InvalidRequest, StoreError
from app.protocol.types import ChatMessage, DecodingParams, GenerateRequest
from app.server.errors import DocumentsUnavailable
from app.server.source import Held

MAX_RESULTS = 50  # conversation search hits per call
MAX_NEIGHBOURS = 5  # passages read on each side of one passage
MAX_ANSWER_TOKENS = 2048
DEFAULT_ANSWER_TOKENS = 256
MAX_CITED_SENTENCES = 3  # require_citations: an answer of 1-3 cited sentences
TOKENS_PER_CITED_SENTENCE = 40
_EVIDENCE = re.compile(r"\[?\s*(?:E:)?\s*([0-9a-fA-F]{12})\s*\]?")
NO_DOCUMENTS = ("this server has no document index: start the port with `hearth serve --documents` (the "
                "desktop app's port has one); `hearth mcp` opens the default collection")


class WritesNotAllowed(HearthError):
    """A write tool was called on a server started without writes allowed (``hearth mcp --allow-writes``)."""


class Library:
    """The person's documents and conversations for MCP tools; every method blocks (call it off the event
    loop) and is safe from any thread.

    ``documents()``: the ``app.assistant.DocumentSource`` searched (None: ``DocumentsUnavailable`` from the
    document tools); ``engine()``: a ``Held`` model for one ``ask`` (released afterwards; None: ``ask`` is
    refused); ``conversations()``: a new ``app.memory.Store`` per call, closed after it (default: the data
    folder's); ``allow_writes``: whether ``ingest`` may run at all (the person still confirms each call)."""

    def __init__(self, documents: Callable[[], Any], *, engine: Optional[Callable[[], Held]] = None,
                 conversations: Optional[Callable[[], Any]] = None, allow_writes: bool = False) -> None:
        self._documents, self._engine = documents, engine
        self._conversations = conversations or _default_conversations
        self.allow_writes = allow_writes
        self._ingest_lock = threading.Lock()

    # -- documents ------------------------------------------------------------------------------------------
    def search_documents(self, query: str, k: int = 5) -> dict[str, Any]:
        """The ``k`` (1-20) best passages for ``query``: ``{"hits": [passage...], "notice"}``, each passage
        ``evidence_id``, ``path``, ``title``, ``page``, ``char_start`` / ``char_end`` (str offsets in the
        document's extracted text), ``headings``, ``score``, ``text``. Raises ``InvalidRequest`` for an empty
        query or ``k`` out of range, ``DocumentsUnavailable`` without documents."""
        k = check_k(k)
        text = _text(query, "query")
        found = self.documents().search(text, k, floor=0.0)  # all k: a search, not a chat turn
        return {"hits": [passage(e, score=True) for e in found.evidence], "notice": found.notice}

    def read_passage(self, evidence_id: str, neighbours: int = 0) -> dict[str, Any]:
        """The passage with this evidence ID (``"a1b2c3d4e5f6"``, also as ``E:…`` or ``[E:…]``), and with
        ``neighbours`` (0-5) > 0 also ``"neighbours"``: up to that many passages on each side in its
        document, each with ``offset`` (-2, -1, 1, 2, ...). Raises ``InvalidRequest`` for a malformed or
        unknown ID (re-indexed or deleted content has new IDs) or ``neighbours`` out of range."""
        eid = evidence_key(evidence_id)
        n = _int_in(neighbours, 0, MAX_NEIGHBOURS, "neighbours")
        with self._document_store() as store:
            found = store.resolve([eid]).get(eid)
            if found is None:
                raise InvalidRequest(f"unknown evidence ID {eid!r}: no indexed passage has it (its document may "
                                     "have changed or been removed; search again)", param="evidence_id")
            out = passage(found)
            if n:
                out["neighbours"] = [{**passage(e), "offset": off} for off, e in _neighbours(store, found, n)]
        return out

    def list_documents(self) -> dict[str, Any]:
        """Every indexed document: ``{"documents": [{path, title, type, pages, chunks, size_bytes,
        indexed_at}]}`` by path (``pages`` None for formats without pages; ``indexed_at`` Unix seconds)."""
        with self._document_store() as store:
            rows = store.documents("status = ?", ["indexed"])
        return {"documents": [{"path": r.path, "title": Path(r.path).name, "type": r.type, "pages": r.page_count,
                               "chunks": r.chunk_count, "size_bytes": r.size, "indexed_at": r.indexed_at}
                              for r in rows]}

    def documents(self) -> Any:
        """The ``DocumentSource``; ``DocumentsUnavailable`` when there is none."""
        docs = self._documents()
        if docs is None:
            raise DocumentsUnavailable(NO_DOCUMENTS)
        return docs

    # -- conversations --------------------------------------------------------------------------------------
    def search_conversations(self, query: str, limit: int = 10) -> dict[str, Any]:
        """Full-text search over every stored message: ``{"results": [{conversation_id, title, message_id,
        role, created, snippet}]}``, best first, at most ``limit`` (1-50); matches in ``snippet`` are in
        ``[`` ``]``. Raises ``InvalidRequest`` for an empty query or ``limit`` out of range."""
        text = _text(query, "query")
        limit = _int_in(limit, 1, MAX_RESULTS, "limit")
        store = self._conversations()
        try:
            hits = store.search(text, limit=limit)
        finally:
            store.close()
        return {"results": [{"conversation_id": h.conversation_id, "title": h.conversation_title,
                             "message_id": h.message_id, "role": h.role, "created": h.created,
                             "snippet": h.snippet} for h in hits]}

    def read_conversation(self, conversation_id: str) -> dict[str, Any]:
        """One conversation (``conversation_id``: its id or a unique prefix): ``conversation_id``, ``title``,
        ``model``, ``created``, ``updated`` and ``messages`` of its current branch, oldest first (``id``,
        ``role``, ``content``, ``created``, ``status``). Raises ``InvalidRequest`` for an empty, unknown or
        ambiguous id."""
        prefix = _text(conversation_id, "conversation_id")
        store = self._conversations()
        try:
            try:
                cid = store.resolve_conversation_id(prefix)
            except StoreError as exc:
                raise InvalidRequest(str(exc), param="conversation_id") from None
            data = store.load_conversation(cid)
            tip = data.conversation.current_message_id
            messages = store.path_to(tip) if tip is not None else data.messages
        finally:
            store.close()
        c = data.conversation
        return {"conversation_id": cid, "title": c.title, "model": c.model, "created": c.created,
                "updated": c.updated, "messages": [{"id": m.id, "role": m.role, "content": m.content,
                                                    "created": m.created, "status": m.status} for m in messages]}

    # -- the model --------------------------------------------------------------------------------------------
    def ask(self, question: str, k: int = 4, max_tokens: int = DEFAULT_ANSWER_TOKENS,
            require_citations: bool = False) -> dict[str, Any]:
        """``question`` answered by the local model from the ``k`` (1-20) best passages (greedy, at most
        ``max_tokens`` 1-2048 tokens; nothing is stored): ``answer``, ``model``, ``finish_reason``, ``cited``
        (evidence IDs the answer cites, in order), ``citations`` (each checked: ``supported``, the citing
        sentence's span ``sentence_start`` / ``sentence_end`` in ``answer``, ``support``), ``all_supported``
        (false when nothing is cited), ``attributions`` (each claim sentence tied to a passage given or to none,
        its facts checked, cited or not: ``evidence.attributions``), ``evidence`` (the passages given) and
        ``notice``.
        ``require_citations``: decode under ``cited_grammar`` (1-3 sentences, ``cited_sentences(max_tokens)``,
        each ending with a citation of a given passage) when passages were found, for models that do not cite
        on their own. Raises
        ``InvalidRequest`` for bad arguments, ``DocumentsUnavailable``, and the engine's errors
        (``NoModelLoaded``, ``ContextLengthExceeded``, ...)."""
        text = _text(question, "question")
        k = check_k(k)
        max_tokens = _int_in(max_tokens, 1, MAX_ANSWER_TOKENS, "max_tokens")
        docs = self.documents()
        if self._engine is None:
            raise InvalidRequest("this server has no model to answer with", param="question")
        held = self._engine()
        try:
            messages, grounding = ground(held.engine, docs, (ChatMessage("user", text),), k=k,
                                         max_tokens=max_tokens)
            ids = [e.evidence_id for e in grounding.evidence]
            grammar = cited_grammar(ids, cited_sentences(max_tokens)) if require_citations and ids else None
            done = held.engine.complete(GenerateRequest(
                messages=messages, decoding=DecodingParams(temperature=0.0, max_tokens=max_tokens, grammar=grammar),
                priority=Caller.PORT.priority))
        finally:
            held.release()
        answer = done.text.rstrip("\n") if grammar else done.text  # the newline that ended it
        checked = grounding.checked_citations(answer)
        return {"answer": answer, "model": held.model, "finish_reason": done.finish_reason,
                "cited": list(dict.fromkeys(c["evidence_id"] for c in checked)), "citations": checked,
                "attributions": grounding.attributions(answer),
                "all_supported": bool(checked) and all(c["supported"] for c in checked),
                "evidence": given(grounding.evidence), "notice": grounding.notice}

    # -- writes -----------------------------------------------------------------------------------------------
    def ingest_path(self, path: str) -> Path:
        """``path`` checked for ``ingest``: absolute (``~`` expanded) and existing. Raises
        ``WritesNotAllowed`` when writes are off, ``InvalidRequest`` (param ``path``) otherwise."""
        if not self.allow_writes:
            raise WritesNotAllowed("writes are off: this MCP server is read-only (start it with `hearth mcp "
                                   "--allow-writes` to offer ingest; each call then asks you first)")
        p = Path(_text(path, "path")).expanduser()
        if not p.is_absolute():
            raise InvalidRequest(f"path must be absolute, got {path!r}", param="path")
        if not p.exists():
            raise InvalidRequest(f"no such file or folder: {str(p)!r}", param="path")
        return p

    def ingest(self, path: str) -> dict[str, Any]:
        """Index a file or folder (``ingest_path`` checks it) into the documents searched here, as ``hearth
        ingest`` does: ``{"files": [{path, status, reason, chunks}], "indexed", "failed"}``. The caller must
        have asked the person first. Raises what ``ingest_path`` raises."""
        from app.assistant import prune_stale_citations
        from app.retrieval.ingest import Ingester

        p = self.ingest_path(path)
        docs = self.documents()
        with self._ingest_lock, self._document_store() as store:
            report = Ingester(store, docs.embedder).ingest([p])
            if any(f.status in ("indexed", "renamed", "removed") for f in report.files):
                prune_stale_citations(doc_store=store)
        return {"files": [{"path": f.path, "status": f.status, "reason": f.reason, "chunks": f.chunks}
                          for f in report.files], "indexed": report.count("indexed"), "failed": len(report.failed)}

    def _document_store(self) -> Any:
        """A connection of its own to the documents' database (one per call: sqlite connections are not
        shared across threads), for reads the ``DocumentSource`` does not offer; closed by ``with``."""
        from app.retrieval.store import DocumentStore

        return DocumentStore(self.documents().store.path)


def cited_grammar(evidence_ids: list[str], max_sentences: int = MAX_CITED_SENTENCES) -> str:
    """GBNF for an answer of 1 to ``max_sentences`` sentences, each ending with a citation: ``<sentence>.
    [E:<id>]``, sentences joined by one space, ``<id>`` one of ``evidence_ids`` (12 hex digits each), then
    optionally one newline, after which only the end of generation is allowed. So the answer may end after
    any complete cited sentence (a base model ends its turn with a newline, which the grammar must allow),
    and must end after ``max_sentences``: a small model never runs on to ``max_tokens`` with its last
    citation cut. A sentence holds no ``.`` (so no decimal point or abbreviation), no newline and no
    brackets; the marker after the period cites that sentence (``app.retrieval.citecheck``'s reading)."""
    if max_sentences < 1:
        raise ValueError(f"max_sentences must be at least 1, got {max_sentences}")
    ids = " | ".join(f'"{evidence_key(i)}"' for i in evidence_ids)
    more = ""
    for _ in range(max_sentences - 1):
        more = f' (" " sentence{more})?'
    return (f'root ::= sentence{more} "\\n"?\n'
            'sentence ::= [^.\\[\\]\\n]+ "." " [E:" id "]"\n'
            f"id ::= {ids}\n")


def cited_sentences(max_tokens: int) -> int:
    """How many cited sentences ``require_citations`` allows in ``max_tokens``: one per
    ``TOKENS_PER_CITED_SENTENCE`` (a sentence and its ``[E:<12 hex digits>]``, ~15-40 tokens), 1 to
    ``MAX_CITED_SENTENCES``."""
    return max(1, min(MAX_CITED_SENTENCES, max_tokens // TOKENS_PER_CITED_SENTENCE))


def _default_conversations() -> Any:
    from app.memory import Store

    return Store()


def passage(e: Any, score: bool = False) -> dict[str, Any]:
    """An ``Evidence`` as a tool result: ``evidence_id``, ``path``, ``title`` (the file name), ``page``,
    ``char_start``, ``char_end``, ``headings``, ``text`` (and ``score`` when asked)."""
    out = {"evidence_id": e.evidence_id, "path": e.path, "title": Path(e.path).name, "page": e.page,
           "char_start": e.char_start, "char_end": e.char_end, "headings": list(e.heading_path), "text": e.text}
    if score:
        out["score"] = e.score
    return out


def evidence_key(value: object) -> str:
    """The 12-hex-digit evidence ID in ``value`` (``"a1b2c3d4e5f6"``, ``"E:a1b2…"``, ``"[E:a1b2…]"``), lower
    case; ``InvalidRequest`` (param ``evidence_id``) for anything else."""
    m = _EVIDENCE.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None:
        raise InvalidRequest(f"evidence_id must be 12 hex digits as search_documents returns them (e.g. "
                             f"'a1b2c3d4e5f6'), got {value!r}", param="evidence_id")
    return m.group(1).lower()


def _neighbours(store: Any, e: Any, n: int) -> Iterator[tuple[int, Any]]:
    """``(offset, Evidence)`` of up to ``n`` passages on each side of ``e`` in its document. Evidence IDs are
    ``evidence_id(document sha256, ordinal)``, so the passage's ordinal is found by hashing, and its
    neighbours' IDs computed, with the store's public reads only."""
    from app.retrieval.store import evidence_id

    doc = store.document(e.path)
    if doc is None or doc.sha256 is None:
        return
    here = next((i for i in range(doc.chunk_count) if evidence_id(doc.sha256, i) == e.evidence_id), None)
    if here is None:
        return
    ids = {evidence_id(doc.sha256, i): i - here
           for i in range(max(0, here - n), min(doc.chunk_count, here + n + 1)) if i != here}
    found = store.resolve(list(ids))
    for eid, off in ids.items():
        if eid in found:
            yield off, found[eid]


def _text(value: object, param: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"{param} must be a non-empty string, got {value!r}", param=param)
    return value.strip()


def _int_in(value: object, low: int, high: int, param: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidRequest(f"{param} must be an integer from {low} to {high}, got {value!r}", param=param)
    return value


__all__ = ["Library", "MAX_K", "WritesNotAllowed", "evidence_key", "passage"]
