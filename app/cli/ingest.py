"""``hearth ingest PATH...``: index files and folders into the default collection (documents.db).

Per-file status lines go to stdout, a progress bar to stderr (when it is a terminal: percentage by bytes,
files, chunks embedded, embedding tokens/s, ETA, the file being read), then a summary. Every failed file is
listed with its reason (e.g. ``encrypted``, ``no text layer (scanned?)``), also with ``-q``. Exit status: 0
when every file was indexed or skipped, 1 when some failed (the others are indexed anyway).
"""

from __future__ import annotations

import argparse
import sys

from app.retrieval.types import STATUS_UNCHANGED, FileStatus, IngestReport, Progress

_BAR_WIDTH = 24


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ingest", help="index files and folders for search (txt, md, rst, code, PDF, DOCX, HTML)",
                       description="Index files and folders into the default collection. Unchanged files are "
                                   "skipped, modified ones re-indexed, deleted ones removed.")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="files or folders (folders are walked); with none (and no --rescan), finish a paused "
                        "re-embed into another embedding model")
    p.add_argument("--rescan", action="store_true", help="also walk every previously ingested path again")
    p.add_argument("--no-embed", action="store_true", help="keyword index only (no embedding model)")
    p.add_argument("--all", action="store_true", help="also list unchanged files")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, only failures and the summary")
    p.add_argument("--watch", action="store_true",
                   help="after indexing, keep watching every ingested path and re-index changes (Ctrl+C stops)")
    p.add_argument("--interval", type=float, default=5.0, metavar="SECONDS",
                   help="with --watch: seconds between polls (default 5)")
    p.add_argument("--embedding-model", metavar="PATH|ID",
                   help="embed documents with this GGUF embedding model (a file, or a recommended model's id; "
                        "'default': the bundled all-MiniLM-L6-v2) and re-embed the library now: search stays "
                        "on the current model until every passage has the new vector (Ctrl+C pauses; "
                        "`hearth ingest`, with or without PATH, resumes)")
    p.add_argument("--pooling", choices=("mean", "cls", "last"),
                   help="with --embedding-model: pool token vectors this way (needed for a chat model's GGUF)")
    p.add_argument("--embedding-models", action="store_true",
                   help="list the recommended embedding models (size, vector size, languages, fit), the one "
                        "search uses and a re-embed in progress, then exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.errors import InvalidRequest
    from app.retrieval.embed_switch import default_ref, desired_ref, reconcile
    from app.retrieval.ingest import Ingester, open_default
    from app.retrieval.store import DocumentStore
    from app.settings import load_user_settings

    if args.embedding_models or args.embedding_model:
        return _embedding_command(args)
    if args.pooling:
        raise InvalidRequest("--pooling goes with --embedding-model", param="pooling")
    if not args.paths and not args.rescan:
        return _resume_only(args)
    if args.watch and not args.interval > 0:
        raise InvalidRequest(f"--interval needs a positive number of seconds, got {args.interval:g}",
                             param="interval")
    if not args.no_embed:
        with DocumentStore() as s:  # a model chosen in settings, on a new library: adopted before indexing
            reconcile(s, desired_ref(load_user_settings()), default_ref())
    store, embedder = open_default(with_embedder=not args.no_embed)
    bar = _ProgressBar(enabled=not args.quiet and sys.stderr.isatty())
    try:
        ingester = Ingester(store, embedder)
        report = IngestReport()
        if args.paths:
            _merge(report, ingester.ingest(args.paths, progress=bar.update))
        if args.rescan:
            _merge(report, ingester.rescan(progress=bar.update))
        bar.finish()
        if any(f.status in ("indexed", "renamed", "removed") for f in report.files):
            from app.assistant import prune_stale_citations

            prune_stale_citations(doc_store=store)
        if args.watch:
            _print_report(report, args, embedder)
            return _watch(ingester, store, args.interval)
    finally:
        if embedder is not None:
            embedder.close()
        store.close()
    _print_report(report, args, embedder)
    status = 1 if report.failed else 0
    if not args.no_embed:  # a re-embed into another model, interrupted or chosen in the app: finish it
        from app.cli._embedding import resume

        with DocumentStore() as s:
            status = max(status, resume(s, args.quiet))
    return status


def _resume_only(args: argparse.Namespace) -> int:
    """``hearth ingest`` with no PATH: finish a re-embed left pending (paused by Ctrl+C, or chosen in the
    app); without one, the usual error."""
    from app.cli._embedding import resume
    from app.errors import InvalidRequest
    from app.retrieval.embed_switch import read_state
    from app.retrieval.store import DocumentStore

    with DocumentStore() as store:
        pending = None if args.no_embed or args.watch else read_state(store).pending
        if pending is None:
            raise InvalidRequest("give at least one PATH, or --rescan (with neither, `hearth ingest` finishes "
                                 "a paused re-embed, and none is paused)", param="paths")
        return resume(store, args.quiet)


def _embedding_command(args: argparse.Namespace) -> int:
    """``--embedding-models`` (list) or ``--embedding-model`` (choose, then re-embed; with PATHs, they are
    indexed first with the model search uses now)."""
    from app.cli import _embedding
    from app.retrieval.store import DocumentStore

    with DocumentStore() as store:
        if args.embedding_models:
            return _embedding.list_models(store)
        ref = _embedding.resolve(args.embedding_model, args.pooling)
        action = _embedding.choose(store, ref)
    if args.paths or args.rescan:
        args.embedding_model = args.embedding_models = None
        args.pooling = None
        return run(args)  # indexes, then resumes the re-embed just recorded
    with DocumentStore() as store:
        if action in ("keep", "cancel", "adopt"):
            print(f"search uses {ref.name}" + (" (the library had no vectors to re-embed)" if action == "adopt"
                                                else ""))
        return _embedding.resume(store, args.quiet)


def _print_report(report: IngestReport, args: argparse.Namespace, embedder) -> None:
    for status in report.files:
        if args.all or (status.status not in (STATUS_UNCHANGED, "skipped") and not (args.quiet and status.ok)):
            print(_line(status))
    print(_summary(report, embedded=embedder is not None or args.no_embed), flush=True)


def _watch(ingester, store, interval_s: float) -> int:
    """Poll the ingested paths until Ctrl+C; print what changed."""
    import threading

    from app.assistant import prune_stale_citations

    _restore_ctrl_c()
    print(f"watching {len(store.roots())} path(s) every {interval_s:g} s (Ctrl+C stops)", file=sys.stderr)

    def changed(report: IngestReport) -> None:
        for status in report.files:
            if status.status not in (STATUS_UNCHANGED, "skipped"):
                print(_line(status), flush=True)
        prune_stale_citations(doc_store=store)

    try:
        ingester.watch(threading.Event(), interval_s, on_report=changed)
    except KeyboardInterrupt:
        print("stopped watching", file=sys.stderr)
    return 0


def _restore_ctrl_c() -> None:
    """Make Ctrl+C stop the watch even when Hearth was started with SIGINT ignored.

    A POSIX shell without job control (a script, ``sh -c``, some IDE terminals) starts a background command
    (``hearth ingest --watch &``) with SIGINT ignored, and Python then leaves it ignored: Ctrl+C or
    ``kill -INT`` would do nothing.
    Watching is meant to run until stopped, so put back Python's default handler (``KeyboardInterrupt``).
    Only the main thread may set handlers; elsewhere (an embedding caller's thread) nothing changes."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _merge(into: IngestReport, other: IngestReport) -> None:
    into.files.extend(other.files)
    into.elapsed_s += other.elapsed_s


def _line(s: FileStatus) -> str:
    detail = f"{s.chunks} chunk{'s' if s.chunks != 1 else ''}" if s.status == "indexed" else (s.reason or "")
    if s.status == "indexed" and s.reason:
        detail += f"; {s.reason}"
    return f"{s.status:<9} {s.path}" + (f"  ({detail})" if detail else "")


def _summary(report: IngestReport, embedded: bool) -> str:
    kinds = ("indexed", "unchanged", "renamed", "duplicate", "removed", "skipped", "failed")
    counts = ", ".join(f"{report.count(k)} {k}" for k in kinds if report.count(k))
    secs = max(report.elapsed_s, 1e-9)
    text = (f"{counts or 'nothing to do'}; {report.chunks} new chunks in {report.elapsed_s:.1f} s "
            f"({report.chunks / secs:.1f} chunks/s)")
    if not embedded:
        text += "\nno embedding model: keyword search (BM25) only; `hearth setup` installs one"
    return text


class _ProgressBar:
    """One line on stderr, redrawn as files finish and as embeddings come back (at most every 0.1 s): bar and
    percentage by bytes of finished files, files done/total, chunks embedded, embedding tokens/s, ETA, and
    the file being read."""

    def __init__(self, enabled: bool, width: int = 100) -> None:
        self.enabled = enabled
        self.drawn = False
        self.width = width
        self._last = 0.0

    def update(self, p: Progress) -> None:
        if not self.enabled:
            return
        import time

        now = time.monotonic()
        if p.files_done < p.files_total and now - self._last < 0.1:
            return
        self._last = now
        sys.stderr.write("\r" + render_bar(p, self.width) + "\x1b[K")
        sys.stderr.flush()
        self.drawn = True

    def finish(self) -> None:
        if self.drawn:
            sys.stderr.write("\n")
            sys.stderr.flush()


def render_bar(p: Progress, width: int = 100) -> str:
    """The progress line for ``p``, at most ``width`` characters (the current file's name is cut first). The
    percentage, rate and ETA are ``app.retrieval.progress.figures``, which the window draws too."""
    from app.retrieval.progress import figures, format_duration

    f = figures(p)
    filled = int(_BAR_WIDTH * f.fraction)
    parts = [f"[{'#' * filled}{'-' * (_BAR_WIDTH - filled)}] {f.percent:3d}%",
             f"{f.files_done}/{f.files_total} files", f"{p.chunks_embedded or p.chunks} chunks"]
    if f.tokens_per_s is not None:
        parts.append(f"{f.tokens_per_s:,.0f} tok/s")
    if f.eta_s is not None:
        parts.append(f"ETA {format_duration(f.eta_s)}")
    line = "  ".join(parts)
    if p.current and not f.finished:
        from pathlib import Path

        room = width - len(line) - 2
        name = Path(p.current).name
        if room >= 8:
            line += "  " + (name if len(name) <= room else name[:room - 1] + "…")
    return line[:width]
