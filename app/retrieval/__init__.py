"""Documents in, evidence out: the retrieval store, ingestion, embeddings and hybrid search (no Qt).

Public API:

The reasoning: docs/retrieval.md, 'app/retrieval/__init__.py'.
"""

from app.retrieval.types import Evidence, FileStatus, IngestReport, Progress, SearchResults

__all__ = ["Evidence", "FileStatus", "IngestReport", "Progress", "SearchResults"]
