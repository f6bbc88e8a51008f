"""``hearth ingest --embedding-model`` / ``--embedding-models``: choose the embedding model, list the
recommended ones, and re-embed the library in the foreground (Ctrl+C pauses; ``hearth ingest``, with or
without paths, or the app resumes). The switch itself is ``app.retrieval.embed_switch`` (docs/retrieval.md,
"Embedding models")."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.errors import InvalidRequest

NON_TTY_EVERY_S = 10.0  # seconds between progress lines when stderr is not a terminal (a log, a pipe)


def resolve(name: str, pooling: str | None) -> Any:
    """The ``ModelRef`` for ``name``: a GGUF file's path (checked by ``embed_switch.check_model_file``), or
    the id of a recommended model that is installed (``default`` names the bundled one). Raises
    ``InvalidRequest`` (param ``embedding_model``) for an unknown id or one not downloaded, naming where
    to get it; ``ModelLoadError`` for a file that is not an embedding model."""
    from app.catalog.embedding_models import for_machine
    from app.retrieval import embed_switch as sw

    if Path(name).expanduser().exists() or name.lower().endswith(".gguf"):
        return sw.check_model_file(name, pooling)[0]
    models = {m.id: m for m in for_machine()}
    m = models.get("all-minilm-l6-v2" if name == "default" else name)
    if m is None:
        raise InvalidRequest(f"{name!r} is neither a file nor a recommended embedding model "
                             f"({', '.join(models)}); `hearth ingest --embedding-models` lists them",
                             param="embedding_model")
    if m.path is None:
        where = ("run `hearth setup` to install it" if m.bundled else
                 f"download {m.file} from Hugging Face ({m.repo}) on the Models page (search {m.repo}), then "
                 "give its id or path again")
        raise InvalidRequest(f"{m.name} is not installed: {where}", param="embedding_model")
    return sw.check_model_file(m.path, pooling)[0]


def list_models(store: Any) -> int:
    """Print the model search uses, a re-embed in progress or failed, and the recommended models."""
    from app.catalog.embedding_models import for_machine
    from app.retrieval import embed_switch as sw

    state = sw.read_state(store)
    active = sw.active_ref(store)
    print(f"search uses: {active.name if active else 'no embedding model (keyword search only)'}")
    if state.pending is not None:
        total = store.stats()["chunks"]
        done = total - store.missing_vectors(state.pending.model_id)
        print(f"re-embedding into {state.pending.name}: {done} / {total} chunks (`hearth ingest` resumes it)")
    if state.failed is not None:
        print(f"last re-embed failed ({state.failed[0]}): {state.failed[1]}")
    print("recommended (id: name · size · vector size · languages · fit · installed):")
    for m in for_machine():
        print(f"  {m.id}: {m.label()}")
    print("any GGUF embedding model file works too: `hearth ingest --embedding-model PATH`; a chat model with "
          "`--pooling mean`")
    return 0


def choose(store: Any, ref: Any) -> str:
    """Save ``ref`` as the setting and record the choice in ``store``; returns ``embed_switch.plan``'s
    action."""
    from app.retrieval import embed_switch as sw
    from app.settings import load_user_settings, save_user_settings

    default = sw.default_ref()
    is_default = default is not None and ref.model_id == default.model_id
    settings = load_user_settings()
    save_user_settings(replace(settings, embedding_model=None if is_default else ref.path,
                               embedding_pooling=None if is_default else ref.pooling))
    return sw.choose(store, ref, default)[0]


def resume(store: Any, quiet: bool = False) -> int:
    """Bring the library to the model the settings ask for (``embed_switch.reconcile``), re-embedding in the
    foreground when that is what it takes. Returns an exit status: 0 done or nothing to do, 1 failed, 130
    paused by Ctrl+C."""
    from app.retrieval import embed_switch as sw
    from app.settings import load_user_settings

    action, state = sw.reconcile(store, sw.desired_ref(load_user_settings()), sw.default_ref())
    if action == sw.BLOCKED:
        print(f"note: the re-embed for {state.failed[0]} failed before ({state.failed[1]}); search stays on "
              f"{state.active.name}. Choose it again with --embedding-model to retry.", file=sys.stderr)
        return 0
    if state.pending is None:
        return 0
    return run_reembed(store, state.pending, quiet)


def run_reembed(store: Any, ref: Any, quiet: bool) -> int:
    """Re-embed into ``ref`` with progress on stderr (unless ``quiet``): one line redrawn at most every 0.2 s
    on a terminal, else a line every ``NON_TTY_EVERY_S`` and at each step; Ctrl+C stops after the batch in
    flight."""
    from app.retrieval import embed_switch as sw

    tty = sys.stderr.isatty()
    show = not quiet and tty
    last: list[Any] = [0.0, None]  # when a line was last written, and of which step

    def progress(p: sw.ReembedProgress) -> None:
        if quiet:
            return
        now, new_step = time.monotonic(), p.counting != last[1] or p.phase not in ("chunks", "leads")
        if not new_step and now - last[0] < (0.2 if tty else NON_TTY_EVERY_S):
            return
        last[0], last[1] = now, p.counting
        if tty:
            sys.stderr.write("\r" + p.text()[:100] + "\x1b[K")
            sys.stderr.flush()
        elif p.phase in ("chunks", "leads"):  # how it ended is printed below
            print(p.text(), file=sys.stderr, flush=True)

    stop = threading.Event()
    embedder = sw.embedder_for(ref)
    try:
        p = sw.reembed(store, embedder, stop, progress)
    except KeyboardInterrupt:
        print(f"\nre-embedding for {ref.name} paused: search stays on the current model; `hearth ingest` "
              "(no path needed) or the app resumes it", file=sys.stderr)
        return 130
    finally:
        embedder.close()
    if show:
        sys.stderr.write("\n")
    print(p.text())
    return 1 if p.phase == "failed" else 0
