"""Application wiring: a stored conversation (``app.memory``) answered by the engine (``app.engine``),
optionally with evidence from the document index (``app.retrieval``).

``app.memory`` never imports the engine (STYLE.md: dependencies point one way); this module is the adapter
the CLI, the server and the desktop app share.
"""

from __future__ import annotations

import logging
from dataclasses import fields
from typing import Any, Iterator

from app.engine.types import ChatMessage, DecodingParams, GenerateRequest

log = logging.getLogger(__name__)


def engine_generate_fn(engine: Any, base: DecodingParams):
    """A ``generate_fn(messages, max_tokens, **opts)`` for ``ChatSession`` backed by ``engine``; ``opts``
    override fields of ``base`` (temperature, stop, seed…)."""

    def generate_fn(messages, max_tokens=None, **opts) -> Iterator[Any]:
        known = {f.name for f in fields(base)}
        dec = base.updated(**{k: v for k, v in opts.items() if k in known}, max_tokens=max_tokens)
        gen = engine.generate(GenerateRequest(messages=tuple(messages), decoding=dec))
        try:
            yield from gen
        finally:
            gen.close()

    return generate_fn


def engine_count_messages(engine: Any):
    """Exact token count of a message list once the chat template is applied (what the engine will see)."""

    def count(messages: list[ChatMessage]) -> int:
        rp = engine.render(GenerateRequest(messages=tuple(messages)))
        return len(engine.tokenize(rp.text, add_bos=rp.add_bos, special=True))

    return count


def open_chat_session(engine: Any, store: Any, *, decoding: DecodingParams, system_prompt: str = "",
                      max_tokens: int | None = None, model_id: str = "") -> Any:
    """A ``ChatSession`` for ``engine`` (loaded) and ``store`` (``app.memory.Store``).

    ``max_tokens``: tokens reserved for each answer (default: ``decoding.max_tokens`` or 256)."""
    from app.memory.chat_session import ChatSession

    n_ctx = engine.settings.n_ctx
    reserve = max_tokens or decoding.max_tokens or 256
    overhead = 5 if engine.info.get("template") in ("gemma", "transcript") else 6
    return ChatSession(store, engine_generate_fn(engine, decoding), engine.count_tokens, n_ctx=n_ctx,
                       max_tokens=reserve, system_prompt=system_prompt, model=model_id or engine.info.get("model", ""),
                       settings={"n_ctx": n_ctx, **{k: v for k, v in engine.settings.to_dict().items()
                                                    if k in ("type_k", "type_v", "flash_attn")}},
                       summary_options={"temperature": 0.0}, message_overhead=overhead,
                       count_messages=engine_count_messages(engine))


class DocumentContext:
    """Evidence from the document index for chat turns (RAG), and citations parsed from the answers.

    ``k``: passages per turn. The evidence block goes after the stable part of the prompt (system prompt,
    summaries, history; see ``app.memory.context``), so the prefix cache still hits on the next turn.
    ``notice`` says when search is degraded (no embedding model: keyword search only).
    """

    def __init__(self, k: int = 4, *, store: Any = None, embedder: Any = None) -> None:
        from app.retrieval.search import Retriever

        if store is None:
            from app.retrieval.ingest import open_default

            store, embedder = open_default()
        self.store, self.embedder, self.k = store, embedder, k
        self.retriever = Retriever(store, embedder)
        self.notice: str | None = None

    def evidence_for(self, query: str, k: int | None = None) -> tuple[str | None, list[Any]]:
        """(prompt block or None when nothing matched, the evidence list). ``k``: passages (default
        ``self.k``)."""
        from app.retrieval.rag import format_evidence_block

        results = self.retriever.search(query, k or self.k)
        self.notice = results.notice
        items = list(results)
        return (format_evidence_block(items) if items else None), items

    @staticmethod
    def citations(answer: str, evidence: list[Any]) -> list[dict]:
        """Structured citations (evidence_id, path, page, quote) for the IDs the answer cites."""
        from app.retrieval.rag import parse_citations

        return [{"evidence_id": c.evidence_id, "path": c.path, "page": c.page, "quote": c.quote}
                for c in parse_citations(answer, evidence)]

    def close(self) -> None:
        self.retriever.close()
        if self.embedder is not None:
            self.embedder.close()
        self.store.close()


def send_with_documents(session: Any, docs: DocumentContext | None, conversation_id: str, text: str,
                        **kw: Any) -> tuple[Any, list[dict], list[dict]]:
    """One turn with evidence: returns (TurnResult, citations stored with the answer, evidence given).

    The model is asked to cite ``[E:<id>]``; only IDs it actually cites become citations (small models often
    cite nothing: then the evidence list still says what the model was given)."""
    if docs is None:
        return session.send(conversation_id, text, **kw), [], []
    block, evidence = docs.evidence_for(text)
    result = session.send(conversation_id, text, evidence=block, **kw)
    cites = docs.citations(result.text, evidence)
    if cites:
        session.store.add_citations(result.message_id, cites)
    given = [{"evidence_id": e.evidence_id, "path": e.path, "page": e.page, "text": e.text} for e in evidence]
    return result, cites, given


def prune_stale_citations(memory_store: Any = None, doc_store: Any = None) -> int:
    """After documents were re-indexed, renamed or deleted: drop stored citations whose evidence is gone and
    move the rest to their document's current path. Opens the default stores when none are given. Returns the
    number of citations removed."""
    from app.memory import Store
    from app.retrieval.store import DocumentStore

    own_mem, own_doc = memory_store is None, doc_store is None
    mem = memory_store or Store()
    docs = doc_store or DocumentStore()
    try:
        return mem.prune_citations(docs.resolve)
    finally:
        if own_mem:
            mem.close()
        if own_doc:
            docs.close()
