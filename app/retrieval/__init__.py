"""Documents in, evidence out: the retrieval store, ingestion, embeddings and hybrid search (no Qt).

Public API:

- ``DocumentStore`` (``store``): documents.db — documents, chunks, FTS5, embeddings; evidence lookup.
- ``Ingester`` (``ingest``): index files/folders, rescan, watch; per-file ``FileStatus``, ``Progress``.
- ``Embedder`` (``embedder``): the embedding engine child process; ``ensure_embedding_model`` (``embed_model``)
  converts the packaged all-MiniLM-L6-v2 into a GGUF file.
- ``Retriever`` / ``search`` (``search``): hybrid BM25 + vector search fused by RRF → ``SearchResults``.
- ``format_evidence_block`` / ``parse_citations`` (``rag``): evidence into the prompt, citations out.

See docs/retrieval.md. Submodules are imported lazily by callers; importing this package loads nothing heavy.
"""

from app.retrieval.types import Evidence, FileStatus, IngestReport, Progress, SearchResults

__all__ = ["Evidence", "FileStatus", "IngestReport", "Progress", "SearchResults"]
