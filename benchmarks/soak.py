"""``hearth bench soak``: mixed load for a given time, then errors, latency drift, and the resident memory
and open files of every Hearth process over time (docs/benchmarks.md, "Soak: hearth bench soak").

By default it starts its own ``hearth serve`` on 127.0.0.1 and a free port, with ``HEARTH_HOME`` a fresh
temporary folder holding a copy of the person's ``settings.json``, the model file hard-linked into its
``models/`` twice (under its own id and ``<id>-soak-b``: two model ids, two engine children; ``--one-model``
for one), the embedding model linked likewise, and a few small text documents ingested (``hearth ingest``)
for ``hearth.documents`` requests (``--documents``; ``--embeddings`` adds ``/v1/embeddings``). The server is
stopped whatever happens (SIGTERM to ``hearth serve``, which closes its children; SIGKILL to its group after
10 s). ``--port-of-existing URL`` soaks a server already running instead (its processes: the one listening
on the port and its descendants).

``--clients`` threads each send one request after another until ``--minutes`` are over, drawing the kind
and the model from their own seeded generator (``benchmarks.soak_client``); a ``Sampler`` thread reads the
processes every ``--sample-s`` seconds (``benchmarks.soak_procs``); ``benchmarks.soak_report`` makes the
summary and the verdicts. Before the clock starts, each model answers one unmeasured request (so no load
falls in the first window), and so do the documents and the embedder.

Writes ``soak.json`` (contract, every request, every sample, the summary), ``soak.txt`` (the summary, also
printed), ``soak.png`` and ``serve.log`` into ``--out`` (default: a new temporary folder). Exit status 0 when
every criterion holds, 1 when one is breached (named in the summary), 2 when the soak cannot run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from benchmarks.soak_client import MAX_TOKENS, WEIGHTS, Mix, send
from benchmarks.soak_report import Thresholds, summarize, summary_text

DOCUMENTS = {
    "ferry.txt": "The island ferry leaves the north pier at 08:10 and 16:40 on weekdays. On Sundays it leaves "
                 "once, at 11:00, and returns at 15:30. Bicycles travel free; cars must be booked a day ahead.",
    "harbour.txt": "The harbour master asks every visiting boat to call on channel 12 before entering, to moor "
                   "on the east pontoon, and to pay the mooring fee of 14 crowns a night at the office.",
    "market.txt": "The fish market opens at six. It sells cod, haddock, mackerel, herring and, in autumn, "
                  "brown crab. The smokehouse at the end of the quay sells smoked mackerel until noon.",
    "lighthouse.txt": "The lighthouse on Gull Point is 31 metres tall, was built in 1872 and has 148 steps. Its "
                      "light flashes white twice every ten seconds and is seen 19 nautical miles away.",
    "stew.txt": "The harbour fish stew: onions, leeks, potatoes, a pinch of saffron, fish stock, cod and "
                "mussels, simmered for twenty minutes, with cream stirred in at the end.",
}
CLOCKS = {"start_s": "the client begins sending the request (before connecting), minus the soak's start",
          "ttft_s": "start → first non-empty content piece of a streamed answer (None for whole answers)",
          "total_s": "start → last byte read, or the client closing the connection (cut, cancel)",
          "t_s": "a process sample's time, minus the soak's start (time.perf_counter, seconds)"}


class BenchError(Exception):
    """A known reason the soak cannot run: one line, no traceback, exit status 2."""


@dataclass
class Target:
    """The server under soak: ``url``, the pid of its root process (None: unknown, no samples), the model
    ids to draw from, the request kinds it takes, and what the contract records about it."""

    url: str
    root_pid: Optional[int]
    models: list[str]
    kinds: dict[str, int]
    contract: dict[str, Any] = field(default_factory=dict)


def parser() -> argparse.ArgumentParser:
    """The arguments of ``hearth bench soak``."""
    p = argparse.ArgumentParser(prog="hearth bench soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, required=True, help="how long the load runs (e.g. 20)")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the clients' mix (default 0)")
    p.add_argument("--out", default=None, metavar="DIR", help="where to write soak.json, soak.txt, soak.png")
    p.add_argument("--port-of-existing", default=None, metavar="URL", help="soak this running server instead")
    p.add_argument("--model", default=None, help="model id or path to serve (default: the bundled model)")
    p.add_argument("--one-model", action="store_true", help="serve one model id, not two")
    p.add_argument("--embeddings", action="store_true", help="add /v1/embeddings requests to the mix")
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help=f"per answer (default {MAX_TOKENS})")
    p.add_argument("--sample-s", type=float, default=5.0, help="seconds between process samples (default 5)")
    p.add_argument("--timeout-s", type=float, default=120.0, help="per request (default 120)")
    p.add_argument("--ready-timeout-s", type=float, default=300.0, help="for the server to start (default 300)")
    th = Thresholds()
    p.add_argument("--ttft-ratio", type=float, default=th.ttft_ratio, help="P99 TTFT last/first limit (1.2)")
    p.add_argument("--rss-growth-mib", type=float, default=th.rss_growth_mib,
                   help="RSS growth after warm-up allowed per process, MiB (16)")
    p.add_argument("--fd-growth", type=float, default=th.fd_growth, help="open-file growth allowed (10)")
    p.add_argument("--warmup-frac", type=float, default=th.warmup_frac, help="warm-up share of the run (0.2)")
    return p


def _check(cfg: argparse.Namespace) -> None:
    for name, ok in (("minutes", cfg.minutes > 0), ("clients", cfg.clients >= 1), ("max_tokens", cfg.max_tokens >= 1),
                     ("sample_s", cfg.sample_s > 0), ("warmup_frac", 0 <= cfg.warmup_frac < 1)):
        if not ok:
            raise BenchError(f"--{name.replace('_', '-')} is out of range: {getattr(cfg, name)}")


def _link(src: Path, dest: Path) -> None:
    """``dest`` the same file as ``src``: a hard link (its own path, so /proc tells two engines apart), else
    a copy (another file system)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def prepare_home(home: Path, model: Optional[str], two_models: bool) -> tuple[Path, list[str], bool]:
    """Fill the soak's data folder: settings, the model file (twice with ``two_models``), the embedding
    model. Returns ``(the model's path in it, the model ids, whether an embedding model is there)``."""
    from app import paths
    from app.catalog.registry import resolve_model
    from app.retrieval.embed_model import ensure_embedding_model

    src = Path(resolve_model(model)).resolve()
    if paths.settings_file().is_file():
        shutil.copyfile(paths.settings_file(), home / "settings.json")
    first = home / "models" / src.name
    _link(src, first)
    ids = [first.stem]
    if two_models:
        _link(src, home / "models" / f"{first.stem}-soak-b.gguf")
        ids.append(f"{first.stem}-soak-b")
    emb = ensure_embedding_model()
    if emb is not None:
        _link(emb, home / "models" / "embeddings" / emb.name)
    return first, ids, emb is not None


def _hearth_argv() -> list[str]:
    exe = Path(sys.executable).with_name("hearth")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "app.cli"]


def ingest_documents(home: Path, env: dict[str, str], out: Path) -> None:
    """Write ``DOCUMENTS`` into ``home/soak-docs`` and index them with ``hearth ingest`` (its output appended
    to ``out/serve.log``). Raises ``BenchError`` when it fails."""
    folder = home / "soak-docs"
    folder.mkdir(exist_ok=True)
    for name, text in DOCUMENTS.items():
        (folder / name).write_text(text + "\n", encoding="utf-8")
    with open(out / "serve.log", "ab") as log:
        r = subprocess.run([*_hearth_argv(), "ingest", "-q", str(folder)], env=env, stdout=log,
                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=600)
    if r.returncode != 0:
        raise BenchError(f"hearth ingest of the soak's documents failed with status {r.returncode} "
                         f"(log {out / 'serve.log'})")


def own_server(cfg: argparse.Namespace, stack: contextlib.ExitStack, out: Path) -> Target:
    """Start ``hearth serve`` over a prepared temporary data folder (stopped with ``stack``)."""
    from benchmarks.load_bench import hearth_serve_command
    from benchmarks.peer import free_port
    from benchmarks.servers import ManagedServer, ServerStartError

    home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hearth-soak-home-")))
    model_path, ids, has_embedder = prepare_home(home, cfg.model, not cfg.one_model)
    if cfg.embeddings and not has_embedder:
        raise BenchError("--embeddings: no embedding model is installed (run `hearth setup`)")
    env = {**os.environ, "HEARTH_HOME": str(home)}
    ingest_documents(home, env, out)
    port = free_port()
    argv = hearth_serve_command(argparse.Namespace(max_queue=None), model_path, port)
    argv += ["--documents"] + (["--embeddings"] if cfg.embeddings else [])
    server = ManagedServer("hearth serve", argv, f"http://127.0.0.1:{port}", out / "serve.log", env=env,
                           ready_timeout_s=cfg.ready_timeout_s, leader_only_term=True)
    stack.callback(server.stop)
    try:
        server.start()
    except ServerStartError as e:
        raise BenchError(str(e)) from None
    kinds = {k: w for k, w in WEIGHTS.items() if k != "embeddings" or cfg.embeddings}
    return Target(server.url, server.pid, ids, kinds,
                  {"server": "hearth serve (started by the soak)", "argv": argv, "home": str(home),
                   "documents": sorted(DOCUMENTS), "model_file": str(model_path)})


def existing_server(cfg: argparse.Namespace) -> Target:
    """A server already running at ``--port-of-existing``: its chat models (two at most) from ``/v1/models``,
    its processes from the pid listening on its port."""
    import httpx

    from benchmarks.soak_procs import listener_pid

    url = cfg.port_of_existing.rstrip("/").removesuffix("/v1")
    try:
        data = httpx.get(f"{url}/v1/models", timeout=10).json().get("data") or []
    except (httpx.HTTPError, ValueError) as e:
        raise BenchError(f"cannot reach the server at {url} ({type(e).__name__}: {e})") from None
    ids = [m["id"] for m in data if "chat" in (m.get("capabilities") or ["chat"])][:1 if cfg.one_model else 2]
    if not ids:
        raise BenchError(f"the server at {url} lists no chat model in /v1/models")
    port = httpx.URL(url).port or 80
    kinds = {k: w for k, w in WEIGHTS.items() if k != "embeddings" or cfg.embeddings}
    pid = listener_pid(port)
    seen = ("its processes: pid %d and its descendants" % pid if pid else
            "no process of this machine listens on its port (or it is not readable): no process samples")
    return Target(url, pid, ids, kinds, {"server": f"already running at {url}; {seen}"})


def warm_up(target: Target, timeout_s: float) -> list[str]:
    """One unmeasured request per model (and documents, embeddings when in the mix) before the clock starts.
    A documents request answered 400 by an existing server drops ``documents`` from the mix (noted); any
    other failure raises ``BenchError``."""
    import httpx

    notes = []
    mix = Mix(target.url, target.models, max_tokens=4, timeout_s=timeout_s)
    asks = [("chat", m) for m in target.models] + [(k, target.models[0]) for k in ("documents", "embeddings")
                                                    if k in target.kinds]
    with httpx.Client(timeout=timeout_s, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for kind, model in asks:
            rec = send(client, mix, kind, model, random.Random(0), time.perf_counter(), -1)
            if rec.status == "ok":
                continue
            if kind == "documents" and rec.http_status == 400:
                target.kinds.pop("documents")
                notes.append(f"documents left out of the mix: the server answered {rec.error}")
                continue
            raise BenchError(f"warm-up {kind} request to {model} failed: {rec.error}")
    return notes


def _client_loop(mix: Mix, idx: int, seed: int, t0: float, deadline: float, stop: threading.Event,
                 records: list) -> None:
    import httpx

    rng = random.Random(f"{seed}:{idx}")
    with httpx.Client(timeout=mix.timeout_s, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        while time.perf_counter() < deadline and not stop.is_set():
            kind, model = mix.draw(rng)
            records.append(send(client, mix, kind, model, rng, t0, idx))


def run_load(cfg: argparse.Namespace, target: Target) -> dict[str, Any]:
    """The soak itself: clients until the time is over, the sampler throughout. Returns the records, the
    samples and the run's planned and actual length."""
    from benchmarks.soak_procs import Sampler

    mix = Mix(target.url, target.models, dict(target.kinds), cfg.max_tokens, cfg.timeout_s)
    records: list = []
    stop = threading.Event()
    t0 = time.perf_counter()
    sampler = Sampler(target.root_pid, t0, cfg.sample_s) if target.root_pid else None
    if sampler:
        sampler.start()
    threads = [threading.Thread(target=_client_loop, name=f"soak-client-{i}", daemon=True,
                                args=(mix, i, cfg.seed, t0, t0 + cfg.minutes * 60, stop, records))
               for i in range(cfg.clients)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stop.set()
        if sampler:
            sampler.stop()
    return {"records": [r.to_dict() for r in records], "samples": sampler.samples if sampler else [],
            "duration_s": cfg.minutes * 60, "elapsed_s": time.perf_counter() - t0}


def _contract(cfg: argparse.Namespace, target: Target, notes: list[str]) -> dict[str, Any]:
    return {"argv": sys.argv, "minutes": cfg.minutes, "clients": cfg.clients, "seed": cfg.seed,
            "max_tokens": cfg.max_tokens, "sample_s": cfg.sample_s, "timeout_s": cfg.timeout_s,
            "url": target.url, "models": target.models, "mix": target.kinds, "root_pid": target.root_pid,
            "notes": notes, "clocks": CLOCKS, **target.contract,
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}}


def write_outputs(out: Path, contract: dict, run: dict, summary: dict) -> None:
    """``soak.json``, ``soak.txt`` and ``soak.png`` (the plot only when matplotlib can be imported)."""
    from benchmarks.soak_report import write_plot

    doc = {"contract": contract, "summary": summary, "records": run["records"], "samples": run["samples"],
           "elapsed_s": run["elapsed_s"]}
    (out / "soak.json").write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
    (out / "soak.txt").write_text(summary_text(summary), encoding="utf-8")
    try:
        write_plot(out / "soak.png", run["records"], run["samples"], run["duration_s"])
    except ImportError as e:
        print(f"hearth: soak.png not written: {e}", file=sys.stderr)


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point (``hearth bench soak ...``): 0 when every criterion holds, 1 when one is breached, 2 when
    the soak cannot run."""
    cfg = parser().parse_args(argv)
    try:
        _check(cfg)
        out = Path(cfg.out) if cfg.out else Path(tempfile.mkdtemp(prefix="hearth-soak-"))
        out.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            target = existing_server(cfg) if cfg.port_of_existing else own_server(cfg, stack, out)
            notes = warm_up(target, cfg.timeout_s)
            print(f"hearth: soaking {target.url} for {cfg.minutes:g} min with {cfg.clients} clients "
                  f"(models {', '.join(target.models)}); output in {out}", file=sys.stderr)
            run = run_load(cfg, target)
    except BenchError as e:
        print(f"hearth: error: {e}", file=sys.stderr)
        return 2
    th = Thresholds(cfg.ttft_ratio, cfg.rss_growth_mib, cfg.fd_growth, cfg.warmup_frac)
    summary = summarize(run["records"], run["samples"], run["duration_s"], th)
    write_outputs(out, _contract(cfg, target, notes), run, summary)
    print(summary_text(summary), end="")
    print(f"(written: {out / 'soak.json'}, {out / 'soak.txt'}, {out / 'soak.png'})")
    return 0 if summary["passed"] else 1
