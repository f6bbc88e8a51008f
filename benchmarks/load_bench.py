"""``hearth bench load``: latency and throughput of an OpenAI-compatible server under six workloads, with the
measurement contract written into every report.

The client streams ``/v1/completions`` (default: no chat template, so two servers prefill the same text) or
``/v1/chat/completions`` with ``httpx`` from threads: ``stream: true``, ``stream_options.include_usage``,
greedy (``temperature: 0``) and a fixed ``max_tokens``. It measures whatever server it is pointed at, Hearth's
FIFO engine included; nothing here knows how the server schedules. The clocks (TTFT, ITL, TPOT, end-to-end,
queueing) and the ok / rejected / failed accounting are defined in ``benchmarks.loadstats``.

Workloads (prompts generated deterministically from ``--seed``, the round and the workload; both targets of
a round get the same prompts, and each round new ones, so no round is served from the previous round's cache):

- ``single``: one stream at a time, ``--repeats`` distinct short prompts (~40 tokens) back to back, each
  answered with ``--single-max-tokens`` tokens (256): TTFT of a short prompt and single-stream decode speed;
- ``long``: one prompt of about ``--long-tokens`` tokens (2500) per round;
- ``multiturn``: one conversation of ``--turns`` turns replayed in order, each turn's history holding the
  previous answers; ``--think-s`` waits between turns are outside every request's clocks and inside the
  conversation's end-to-end time (``extra.conversation_e2e_s``);
- ``poisson``: open loop, ``--requests`` arrivals per rate at each of ``--rates`` requests/s (Poisson process,
  ``loadstats.poisson_arrivals``), a ``--long-fraction`` of them long prompts, the rest short; a request is
  sent at its arrival time whether or not earlier ones have finished;
- ``closed``: ``--clients`` clients, each sending ``--requests-per-client`` short prompts, the next as soon as
  the previous one ends;
- ``agent``: agent sessions across a restart (``benchmarks.agent_workload``): a ~1,500-token preamble, a
  session of ``--agent-steps`` steps, a restart and a new session, a restart and the first session continued,
  and process start → first token of a long prompt sent before a restart. It restarts the servers, so it runs
  only on targets the benchmark started as processes (Hearth as ``hearth serve``, llama-server).

Targets: by default Hearth's own server as a ``hearth serve`` process (``--hearth-server process``) over the
bundled model or ``--model``, on 127.0.0.1 and a free port, with its data folder (``HEARTH_HOME``) a fresh
temporary folder holding a copy of the person's ``settings.json``: its disk prefix cache is cold at the start
and warmed only by this run's requests (``--no-prefix-cache`` turns it off), and survives the ``agent``
workload's restarts. ``--hearth-server thread`` serves it on threads of this process instead
(``app.server.ServerThread`` over an ``Engine``; no restarts). ``--url URL`` measures any OpenAI-compatible
server instead; ``--compare URL`` adds a second server, run alternately with the first (per round, each
workload on the first target, then on the second) and reported as ratios second/first. ``--peer
llama-server`` makes that second server llama.cpp's own (``make bench-peer``, ``benchmarks.peer``), started
here over the first target's model file, slots, context per slot and threads, at llama-server's own
defaults for everything else (``--peer-settings defaults``) or with Hearth's batches, KV types, flash
attention and SWA cache too (``--peer-settings matched``), and stopped at the end.

Resident memory: right after each server the benchmark starts is ready (before any request), and again at
the end of the run, the RSS (and PSS) of its process and every descendant (``benchmarks.rss_tree``); for
``--hearth-server thread`` that is this benchmark's process, client included (the report says so).
Output: a Markdown table on stdout (``--json``: the whole record), and with ``--out DIR`` ``load.json``,
``load.md`` and PNG plots (``benchmarks.load_report``).

Run: ``hearth bench load [--workloads closed,poisson] [--rates 0.5,1] [--compare http://127.0.0.1:8080 |
--peer llama-server [--peer-settings defaults|matched]]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from benchmarks.loadstats import SLO, RequestRecord, poisson_arrivals

log = logging.getLogger(__name__)

WORKLOADS = ("single", "long", "multiturn", "poisson", "closed", "agent", "quote")
RESTARTING = ("agent",)  # workloads that restart the servers
OPT_IN = ("quote",)  # workloads that run only when --workloads names them
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
MULTITURN_STOP = ("\nUser:",)


class BenchError(Exception):
    """A known reason the benchmark cannot run (unreachable server, no model name...): one line, no traceback."""


# -- prompts (deterministic from a random.Random) -------------------------------------------------------------
NAMES = ("Mara", "Tomas", "Ines", "Oskar", "Lena", "Farid", "Greta", "Yusuf", "Alba", "Niko", "Sunniva", "Ravi")
TRADES = ("baker", "ferry pilot", "clockmaker", "librarian", "beekeeper", "cartographer", "glassblower",
          "lighthouse keeper", "tailor", "surveyor")
PLACES = ("a harbour town", "the hill village of Arden", "a city of canals", "a mining town in the north",
          "an island with one road", "the river port of Vell")
FINDS = ("a sealed letter", "an old brass key", "a map with one island missing", "a stopped pocket watch",
         "a ledger with a torn page", "a box of seeds from far away")
CARGO = ("salt", "timber", "wool", "copper", "grain", "lamp oil", "rope", "tea", "iron nails", "dried fish")
SHIPS = ("Heron", "Marigold", "North Star", "Patience", "Kestrel", "Old Grey", "Swift", "Juniper")
WEATHER = ("a calm sea", "fog until noon", "a strong west wind", "rain and low cloud", "clear skies",
           "a rising storm")


def short_prompt(rng: random.Random) -> str:
    """A story opening of about 40 tokens that a base model continues (text only; no chat markers)."""
    name = rng.choice(NAMES)
    return (f"The story of {name}, a {rng.choice(TRADES)} from {rng.choice(PLACES)}.\n\n"
            f"One morning {name} found {rng.choice(FINDS)} on the doorstep. It was the strangest thing, "
            f"because")


# Gemma 3's tokenizer reads the ledger sentences below at 3.73 characters per token (measured on the bundled
# model: 13,357 characters = 3,585 tokens); the report shows the server's own count (usage.prompt_tokens).
LEDGER_CHARS_PER_TOKEN = 3.73


def long_prompt(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of harbour-ledger sentences, then an open line to continue."""
    lines = ["The harbour ledger, copied out in full:\n"]
    size = len(lines[0])
    while size < tokens * LEDGER_CHARS_PER_TOKEN:
        line = (f"On day {rng.randint(1, 28)} of month {rng.randint(1, 12)} the {rng.choice(SHIPS)} came in "
                f"from {rng.choice(PLACES)} with {rng.randint(2, 90)} crates of {rng.choice(CARGO)} under "
                f"captain {rng.choice(NAMES)}, and the log noted {rng.choice(WEATHER)}.\n")
        lines.append(line)
        size += len(line)
    lines.append("\nThe clerk who kept this ledger wrote at the bottom of the last page:")
    return "".join(lines)


def quote_prompt(rng: random.Random, lines: int = 14) -> str:
    """A ledger of ``lines`` lines (about 35 tokens each), then the start of a word-for-word copy of it: an answer
    that quotes its document, as a code edit, a tool result read back or a cited passage does (a base model
    copies it). The same text goes to every server."""
    rows = [f"On day {rng.randint(1, 28)} of month {rng.randint(1, 12)} the {rng.choice(SHIPS)} came in from "
            f"{rng.choice(PLACES)} with {rng.randint(2, 90)} crates of {rng.choice(CARGO)} under captain "
            f"{rng.choice(NAMES)}.\n" for _ in range(lines)]
    return ("The harbour ledger:\n" + "".join(rows) + "\nThe same ledger, copied out again word for word:\n"
            + rows[0])


def follow_up(rng: random.Random) -> str:
    """A user turn that continues a conversation."""
    return rng.choice(("What happened next?", "Who else was there?", "Why did that matter?",
                       "Describe the place in more detail.", "What did they decide to do?"))


def transcript(messages: Sequence[tuple[str, str]]) -> str:
    """Chat messages as one plain completion prompt (``User:`` / ``Assistant:`` lines, open assistant turn)."""
    return "".join(f"{'User' if r == 'user' else 'Assistant'}: {c}\n" for r, c in messages) + "Assistant:"


def cell_rng(seed: int, rnd: int, label: str) -> random.Random:
    """The prompt generator of one workload cell in one round (the same for every target)."""
    return random.Random(f"{seed}:{rnd}:{label}")


# -- targets --------------------------------------------------------------------------------------------------
@dataclass
class Target:
    """A server under test: ``name`` (``hearth``, ``llama-server``, ``target`` or ``other``), base ``url`` (no
    ``/v1``), the ``model`` field sent, what is known of it (``contract``), its HTTP client (set by
    ``open_targets``), the ``benchmarks.servers.ManagedServer`` when the benchmark started it as a process
    (``server``; None otherwise), and the pid whose process tree is its memory (``memory_pid``; None: unknown)."""

    name: str
    url: str
    model: str
    contract: dict[str, Any]
    client: Any = None
    server: Any = None
    memory_pid: Optional[int] = None
    memory_note: str = ""

    @property
    def restartable(self) -> bool:
        return self.server is not None

    def memory(self) -> Optional[dict[str, Any]]:
        """``rss_tree.tree_memory`` of the target's process tree now (None when unknown)."""
        from benchmarks.rss_tree import tree_memory

        return None if self.memory_pid is None else tree_memory(self.memory_pid, note=self.memory_note)

    def restart(self) -> dict[str, float]:
        """Stop the server process and start it again (same command, environment and data folder); returns
        ``ManagedServer.restart``'s timings. The memory pid follows the new process."""
        t = self.server.restart()
        self.memory_pid = self.server.pid
        return t


def base_url(url: str) -> str:
    """``http://h:p``, ``http://h:p/`` and ``http://h:p/v1`` → ``http://h:p``; raises ``BenchError`` for a URL
    without http(s)://."""
    u = url.strip().rstrip("/")
    if u.endswith("/v1"):
        u = u[:-3]
    if not u.startswith(("http://", "https://")):
        raise BenchError(f"server URL must start with http:// or https://, got {url!r}")
    return u


def discover_model(url: str, api_key: Optional[str], served_model: Optional[str]) -> str:
    """The model name to send: ``served_model``, else the loaded (Hearth) or first id of ``GET /v1/models``.
    Raises ``BenchError`` when the server cannot be reached or names no model."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{url}/v1/models", headers=headers, timeout=10)
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach the server at {url} ({type(e).__name__}: {e})") from None
    if served_model:
        return served_model
    try:
        body = r.json() if r.status_code == 200 else {}
    except ValueError:
        body = {}
    data = [m for m in (body.get("data") or []) if isinstance(m, dict) and "id" in m] if isinstance(body, dict) \
        else []
    if not data:
        raise BenchError(f"GET {url}/v1/models answered HTTP {r.status_code} without a model; pass "
                         "--served-model NAME" + (" (and --api-key KEY)" if r.status_code == 401 else ""))
    loaded = [m for m in data if isinstance(m.get("hearth"), dict) and m["hearth"].get("loaded")]
    return str((loaded or data)[0]["id"])


def url_target(name: str, url: str, cfg: argparse.Namespace) -> Target:
    """Any OpenAI-compatible server: what the client cannot know stays ``None`` in the contract."""
    u = base_url(url)
    model = discover_model(u, cfg.api_key, cfg.served_model)
    return Target(name, u, model, {"kind": "url", "url": u, "model": model, "model_path": None,
                                   "model_sha256": None, "load_settings": None,
                                   "cache_state": "server-managed (unknown to the client)"})


def hearth_target(cfg: argparse.Namespace, stack: contextlib.ExitStack, engine: Any = None) -> Target:
    """Hearth's own server on threads of this process, on 127.0.0.1 (a free port) over ``engine``, or over an
    engine loaded here from the load flags (closed with ``stack``). Its memory is this process's tree (client
    included). Raises ``HearthError`` when the model cannot be loaded."""
    from app.server import ServerThread, create_app
    from app.server.models import loaded_id
    from app.settings import ServerSettings

    if engine is None:
        engine, cache_state = _load_engine(cfg, stack)
    else:
        cache_state = _cache_state(engine.cache_cfg, "the caller's engine")
    if cfg.max_queue is not None:
        engine.max_queue = cfg.max_queue
    srv = stack.enter_context(ServerThread(create_app(engine, ServerSettings())))
    model = loaded_id(engine)
    note = ("Hearth served on threads of the benchmark's own process (--hearth-server thread): this is the "
            "benchmark process and its children, so the client's own memory is included")
    return Target("hearth", srv.url, model, {"kind": "hearth", "process": "thread", "url": srv.url, "model": model,
                                             **_model_identity(engine.model_path),
                                             "load_settings": _asdict(engine.settings),
                                             "max_queue": engine.max_queue, "engine_info": dict(engine.info),
                                             "cache_state": cache_state},
                  memory_pid=os.getpid(), memory_note=note)


# Engine flags of `hearth bench load` passed on to `hearth serve` as given (None: not given, so `hearth serve`
# takes the saved setting, as the in-process target does).
SERVE_VALUE_FLAGS = (("n_ctx", "--n-ctx"), ("n_batch", "--n-batch"), ("n_ubatch", "--n-ubatch"),
                     ("n_threads", "--n-threads"), ("n_gpu_layers", "--n-gpu-layers"), ("parallel", "--parallel"),
                     ("type_k", "--type-k"), ("type_v", "--type-v"), ("cache_budget_mb", "--cache-budget-mb"))


def hearth_serve_command(cfg: argparse.Namespace, model: Any, port: int, host: str = "127.0.0.1") -> list[str]:
    """The ``hearth serve`` command line of the process target: ``--model`` (a path), ``--ttl -1`` (the model
    is never unloaded for idleness while the other target runs), ``--max-queue`` and the engine flags when
    given here, nothing else."""
    exe = Path(sys.executable).with_name("hearth")
    argv = [str(exe)] if exe.is_file() else [sys.executable, "-m", "app.cli"]
    argv += ["serve", "--host", host, "--port", str(port), "--model", str(model), "--ttl", "-1"]
    if cfg.max_queue is not None:
        argv += ["--max-queue", str(cfg.max_queue)]
    for attr, flag in SERVE_VALUE_FLAGS:
        v = getattr(cfg, attr, None)
        if v is not None:
            argv += [flag, f"{v:g}" if isinstance(v, float) else str(v)]
    for attr, off, on in (("flash_attn", "--no-flash-attn", "--flash-attn"), ("offload_kqv", "--no-kv-offload", None),
                          ("use_mmap", "--no-mmap", None), ("use_mlock", None, "--mlock")):
        v = getattr(cfg, attr, None)
        flag = on if v is True else off if v is False else None
        if flag:
            argv.append(flag)
    if not getattr(cfg, "prefix_cache", True):
        argv.append("--no-prefix-cache")
    return argv


def hearth_process_target(cfg: argparse.Namespace, stack: contextlib.ExitStack) -> Target:
    """Hearth's own server as a ``hearth serve`` process (``hearth_serve_command``) on 127.0.0.1 and a free
    port, its data folder (``HEARTH_HOME``) a fresh temporary folder holding a copy of the person's
    ``settings.json`` (so the same saved settings apply as in the in-process target), its output in a kept
    temporary log. Stopped with ``stack`` (SIGTERM to the server, which closes its engine). Raises
    ``BenchError`` when it does not start, ``HearthError`` when the model cannot be found."""
    import httpx

    from app import paths
    from app.catalog.registry import resolve_model
    from app.cli._engine_args import load_settings
    from app.settings import load_user_settings
    from benchmarks.peer import free_port
    from benchmarks.servers import ManagedServer, ServerStartError

    model = Path(resolve_model(cfg.model)).resolve()
    settings = load_settings(cfg)  # what `hearth serve` will compute from the same file and flags
    home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hearth-bench-home-")))
    if paths.settings_file().is_file():
        shutil.copyfile(paths.settings_file(), home / "settings.json")
    port = free_port()
    argv = hearth_serve_command(cfg, model, port)
    fd, log = tempfile.mkstemp(prefix="hearth-bench-serve-", suffix=".log")
    os.close(fd)
    server = ManagedServer("hearth serve", argv, f"http://127.0.0.1:{port}", log,
                           env={**os.environ, "HEARTH_HOME": str(home)}, ready_timeout_s=cfg.ready_timeout_s,
                           leader_only_term=True)
    stack.callback(server.stop)
    try:
        t = server.start()
    except ServerStartError as e:
        raise BenchError(str(e)) from None
    try:
        health = httpx.get(f"{server.url}/health", timeout=10).json()
    except (httpx.HTTPError, ValueError) as e:
        raise BenchError(f"hearth serve on {server.url} answered /health badly: {e}") from None
    model_id = cfg.served_model or str(health.get("model") or model.stem)
    ls = _asdict(settings)
    ls["n_parallel"] = health.get("n_parallel") or ls.get("n_parallel")
    if ls.get("n_threads") is None:  # the engine's own default, as the peer gets it (-t)
        from app.childhost import default_threads

        ls["n_threads"] = default_threads()
    max_queue = cfg.max_queue if cfg.max_queue is not None else load_user_settings().server.max_queue
    cache_state = ("prefix cache off" if not cfg.prefix_cache else
                   "prefix cache on, disk part in the server's data folder (a fresh temporary HEARTH_HOME): cold "
                   "at the start of the run; later requests may reuse prefixes of earlier ones (live KV or "
                   "disk), across the agent workload's restarts too")
    return Target("hearth", server.url, model_id,
                  {"kind": "hearth", "process": "hearth serve", "url": server.url, "model": model_id,
                   **_model_identity(model), "load_settings": ls, "max_queue": max_queue,
                   "engine_info": {"n_parallel": health.get("n_parallel")}, "cache_state": cache_state,
                   "argv": argv, "command": " ".join(argv), "env": {"HEARTH_HOME": str(home)}, "log": log,
                   "spawn_to_ready_s": t["ready_s"] - t["started_s"]},
                  server=server, memory_pid=server.pid,
                  memory_note="the `hearth serve` process and its descendants (engine process, "
                              "multiprocessing's resource tracker); the benchmark client is not included")


def _load_engine(cfg: argparse.Namespace, stack: contextlib.ExitStack) -> tuple[Any, str]:
    from app.catalog.registry import resolve_model
    from app.cli._engine_args import load_settings
    from app.engine.local.engine import Engine
    from app.settings import load_user_settings

    path = resolve_model(cfg.model)
    cache = None
    if cfg.prefix_cache:
        opts = load_user_settings().prefix_cache_options(cfg.cache_budget_mb)
        if opts is not None:
            cache = {**opts, "dir": stack.enter_context(tempfile.TemporaryDirectory(prefix="hearth-bench-kv-"))}
    engine = Engine(path, load_settings(cfg), prefix_cache=cache,
                    max_queue=load_user_settings().server.max_queue)
    stack.callback(engine.close)
    engine.load()
    return engine, _cache_state(cache, "a fresh temporary folder")


def _cache_state(cache_cfg: Optional[dict], where: str) -> str:
    if not cache_cfg:
        return "prefix cache off"
    return (f"prefix cache on, disk part in {where}: cold at the start of the run; later requests may reuse "
            "prefixes of earlier ones (live KV or disk)")


def _model_identity(path: Any) -> dict[str, Any]:
    from app.catalog.gguf import file_sha256

    try:
        sha = file_sha256(path)
    except OSError as e:
        sha = None
        log.warning("cannot hash %s: %s", path, e)
    return {"model_path": str(path), "model_sha256": sha}


def _asdict(obj: Any) -> Any:
    from dataclasses import asdict, is_dataclass

    return asdict(obj) if is_dataclass(obj) else obj


def peer_target(cfg: argparse.Namespace, stack: contextlib.ExitStack, first: Target) -> Target:
    """llama.cpp's own llama-server (``benchmarks.peer``) on a free port, stopped with ``stack``: over Hearth's
    model file and load settings (its loaded slot count) when ``first`` is Hearth's server, else over
    ``--model`` and the load flags. Raises ``BenchError`` when it cannot start."""
    from benchmarks import peer

    c = first.contract
    mode = cfg.peer_settings
    if c["kind"] == "hearth":
        pcfg = peer.PeerConfig.from_load_settings(c["model_path"], c["load_settings"],
                                                  (c.get("engine_info") or {}).get("n_parallel"), mode=mode)
        identity = {"model_path": c["model_path"], "model_sha256": c["model_sha256"]}
    else:
        from app.catalog.registry import resolve_model
        from app.cli._engine_args import load_settings

        pcfg = peer.PeerConfig.from_load_settings(resolve_model(cfg.model), load_settings(cfg), mode=mode)
        identity = _model_identity(pcfg.model)
    try:
        server = stack.enter_context(peer.llama_server(pcfg, ready_timeout_s=cfg.ready_timeout_s))
    except peer.PeerError as e:
        raise BenchError(str(e)) from None
    t = url_target(peer.NAME, server.url, cfg)
    t.contract.update({**identity, "kind": peer.NAME, "load_settings": pcfg.load_settings(), **server.contract(),
                       "cache_state": "llama-server's own prompt cache (slots, --cache-ram), empty at the start "
                                      "and after each restart (memory only)"})
    t.server, t.memory_pid = server.server, server.server.pid
    t.memory_note = "the llama-server process (and descendants: none expected)"
    return t


@contextlib.contextmanager
def open_targets(cfg: argparse.Namespace, engine: Any = None):
    """Yield the targets in run order (first: ``--url`` or Hearth's own server; second: ``--compare`` or
    ``--peer``), each with an open ``httpx.Client``; everything started here (engine, servers, clients) is
    stopped on exit, whatever happens."""
    import httpx

    if cfg.compare and cfg.peer:
        raise BenchError("--compare and --peer both name the second target; pass one of them")
    with contextlib.ExitStack() as stack:
        first = url_target("target", cfg.url, cfg) if cfg.url else None
        other = url_target("other", cfg.compare, cfg) if cfg.compare else None
        if first is None:
            if engine is None and cfg.hearth_server == "process":
                first = hearth_process_target(cfg, stack)
            else:
                first = hearth_target(cfg, stack, engine)
        first.contract["memory_after_load"] = first.memory()  # before any request (and before the peer starts)
        if cfg.peer:
            other = peer_target(cfg, stack, first)
            other.contract["memory_after_load"] = other.memory()
        targets = [t for t in (first, other) if t is not None]
        headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        # A new connection per request (no keep-alive): a server that closes an idle kept-alive connection
        # (llama-server does) would otherwise fail the next request sent on it ("Server disconnected without
        # sending a response"), an error of the client's connection reuse, not of the server. Connecting on
        # 127.0.0.1 costs well under a millisecond and is inside every TTFT alike.
        for t in targets:
            t.client = stack.enter_context(httpx.Client(
                base_url=t.url, headers=headers, timeout=httpx.Timeout(cfg.timeout_s, connect=10.0),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=0)))
        yield targets


# -- one request ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ask:
    """One request to send: the conversation so far (``(role, text)`` pairs), stop strings, the label of its
    workload cell, its kind (short, long or turn) and whether it is a conversation (``turn``: on the
    completions endpoint every turn, the first included, is a transcript, so each turn's prompt starts with
    the previous turn's)."""

    messages: tuple[tuple[str, str], ...]
    label: str
    stop: tuple[str, ...] = ()
    kind: str = "short"

    @property
    def conversation(self) -> bool:
        return self.kind == "turn" or len(self.messages) > 1


def request_body(endpoint: str, model: str, ask: Ask, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of ``ask`` on ``endpoint`` (``completions``: a conversation as a plain
    transcript, a single prompt as it is; ``chat``: the messages)."""
    body: dict[str, Any] = {"model": model, "temperature": 0, "max_tokens": max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}}
    if ask.stop:
        body["stop"] = list(ask.stop)
    if endpoint == "chat":
        body["messages"] = [{"role": r, "content": c} for r, c in ask.messages]
    else:
        body["prompt"] = transcript(ask.messages) if ask.conversation else ask.messages[0][1]
    return ENDPOINTS[endpoint], body


def send(target: Target, endpoint: str, ask: Ask, max_tokens: int) -> RequestRecord:
    """Stream one request and return what the client saw; never raises for the server's or the network's
    faults (HTTP 429 → ``rejected``; any other status, a connection error, an error event or a stream cut
    before ``data: [DONE]`` → ``failed``)."""
    import httpx

    path, body = request_body(endpoint, target.model, ask, max_tokens)
    rec = RequestRecord(label=ask.label)
    rec.send_s = time.perf_counter()
    try:
        with target.client.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                _http_error(rec, r)
            else:
                _consume(rec, r, endpoint)
    except httpx.HTTPError as e:
        rec.status, rec.error = "failed", f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - a client bug must not stop the other requests; logged in full
        log.exception("benchmark client error")
        rec.status, rec.error = "failed", f"client error {type(e).__name__}: {e}"
    if rec.end_s is None:
        rec.end_s = time.perf_counter()
    return rec


def _http_error(rec: RequestRecord, r: Any) -> None:
    raw = r.read()
    rec.end_s = time.perf_counter()
    rec.http_status = r.status_code
    rec.status = "rejected" if r.status_code == 429 else "failed"
    try:
        msg = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = raw[:200].decode("utf-8", "replace")
    retry = r.headers.get("retry-after")
    rec.error = f"HTTP {r.status_code}: {msg}" + (f" (Retry-After {retry})" if retry else "")


def _consume(rec: RequestRecord, r: Any, endpoint: str) -> None:
    rec.http_status = 200
    done, pieces = False, []
    for line in r.iter_lines():
        now = time.perf_counter()
        if not line.startswith("data:"):
            continue  # blank separators, SSE comments, event: lines
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            continue
        try:
            obj = json.loads(data)
        except ValueError:
            rec.status, rec.error = "failed", f"bad SSE data: {data[:120]!r}"
            break
        if not isinstance(obj, dict):
            rec.status, rec.error = "failed", f"SSE data is not a JSON object: {data[:120]!r}"
            break
        if obj.get("error") is not None:
            err = obj["error"]
            rec.status = "failed"
            rec.error = "error event: " + (err.get("message", str(err)) if isinstance(err, dict) else str(err))
            break
        _chunk(rec, obj, endpoint, now, pieces)
    rec.end_s = time.perf_counter()
    rec.text = "".join(pieces)
    if rec.status == "ok" and not done:
        rec.status, rec.error = "failed", "stream ended before data: [DONE]"
    if rec.tokens_source == "deltas":
        rec.completion_tokens = len(rec.token_times)


def _chunk(rec: RequestRecord, obj: dict, endpoint: str, now: float, pieces: list[str]) -> None:
    choices = obj.get("choices") or []
    if choices:
        ch = choices[0]
        text = ch.get("text") if endpoint == "completions" else (ch.get("delta") or {}).get("content")
        if text:
            if rec.first_token_s is None:
                rec.first_token_s = now
            rec.token_times.append(now)
            pieces.append(text)
    usage = obj.get("usage")
    if isinstance(usage, dict):
        rec.tokens_source = "usage"
        rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        rec.completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            rec.cached_tokens = int(details["cached_tokens"])
    hearth = obj.get("hearth")
    metrics = hearth.get("metrics") if isinstance(hearth, dict) else None
    if isinstance(metrics, dict) and isinstance(metrics.get("queue_s"), (int, float)):
        rec.queue_s = float(metrics["queue_s"])


# -- workloads ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One workload at one setting: ``label`` names it in the report (``poisson@0.5rps``)."""

    workload: str
    label: str
    rate: Optional[float] = None


def cells(cfg: argparse.Namespace) -> list[Cell]:
    out = []
    for w in cfg.workloads:
        if w == "poisson":
            out += [Cell(w, f"poisson@{r:g}rps", r) for r in cfg.rates]
        else:
            out.append(Cell(w, w))
    return out


@dataclass
class CellRun:
    """The records of one cell on one target in one round, and what the workload adds (``extra``)."""

    cell: Cell
    target: str
    round: int
    records: list[RequestRecord]
    extra: dict[str, Any] = field(default_factory=dict)


def run_cell(cfg: argparse.Namespace, target: Target, cell: Cell, rnd: int) -> CellRun:
    """Run ``cell`` once on ``target``; the prompts depend only on (seed, round, cell)."""
    rng = cell_rng(cfg.seed, rnd, cell.label)
    runner = {"single": _single, "long": _long, "multiturn": _multiturn, "poisson": _poisson,
              "closed": _closed, "agent": _agent, "quote": _quote}[cell.workload]
    records, extra = runner(cfg, target, cell, rng)
    return CellRun(cell, target.name, rnd, records, extra)


def _ask(cfg: argparse.Namespace, cell: Cell, rng: random.Random, long: bool = False) -> Ask:
    text = long_prompt(rng, cfg.long_tokens) if long else short_prompt(rng)
    return Ask(((("user", text),)), cell.label, kind="long" if long else "short")


def _single(cfg, target, cell, rng) -> tuple[list[RequestRecord], dict]:
    asks = [_ask(cfg, cell, rng) for _ in range(cfg.repeats)]
    return [send(target, cfg.endpoint, a, cfg.single_max_tokens) for a in asks], {"max_tokens": cfg.single_max_tokens}


def _quote(cfg, target, cell, rng) -> tuple[list[RequestRecord], dict]:
    """One stream at a time, ``repeats`` answers that copy their prompt's document (``quote_prompt``)."""
    asks = [Ask((("user", quote_prompt(rng)),), cell.label, kind="quote") for _ in range(cfg.repeats)]
    return [send(target, cfg.endpoint, a, cfg.single_max_tokens) for a in asks], {"max_tokens": cfg.single_max_tokens}


def _long(cfg, target, cell, rng) -> tuple[list[RequestRecord], dict]:
    return [send(target, cfg.endpoint, _ask(cfg, cell, rng, long=True), cfg.max_tokens)], {}


def _multiturn(cfg, target, cell, rng) -> tuple[list[RequestRecord], dict]:
    """Turns in order; each waits ``think_s`` after the previous answer (outside the request's clocks)."""
    messages: list[tuple[str, str]] = [("user", short_prompt(rng))]
    follow = [follow_up(rng) for _ in range(cfg.turns - 1)]
    records: list[RequestRecord] = []
    t0 = time.perf_counter()
    for i in range(cfg.turns):
        if i:
            time.sleep(cfg.think_s)
        rec = send(target, cfg.endpoint, Ask(tuple(messages), cell.label, MULTITURN_STOP, "turn"), cfg.max_tokens)
        rec.wait_before_s = cfg.think_s if i else 0.0
        records.append(rec)
        if rec.status != "ok":
            break  # the conversation cannot go on without this answer; the turns not sent are reported
        if i < cfg.turns - 1:
            messages += [("assistant", rec.text.strip()), ("user", follow[i])]
    end = time.perf_counter()
    return records, {"turns_planned": cfg.turns, "turns_sent": len(records), "think_s": cfg.think_s,
                     "think_s_total": cfg.think_s * (len(records) - 1), "conversation_e2e_s": end - t0}


def _poisson(cfg, target, cell, rng) -> tuple[list[RequestRecord], dict]:
    """Open loop: each request sent at its arrival time on its own thread, whatever is still running."""
    arrivals = poisson_arrivals(cell.rate, cfg.requests, seed=zlib.crc32(f"{cfg.seed}:{cell.label}".encode()))
    asks = [_ask(cfg, cell, rng, long=rng.random() < cfg.long_fraction) for _ in arrivals]
    records: list[Optional[RequestRecord]] = [None] * len(asks)
    late = [0.0]

    def fire(i: int) -> None:
        records[i] = send(target, cfg.endpoint, asks[i], cfg.max_tokens)

    threads = []
    t0 = time.perf_counter()
    for i, at in enumerate(arrivals):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        late[0] = max(late[0], time.perf_counter() - (t0 + at))
        th = threading.Thread(target=fire, args=(i,), name=f"bench-poisson-{i}", daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    kinds = [a.kind for a in asks]
    return [r for r in records if r is not None], {
        "offered_rate_rps": cell.rate, "arrivals_s": arrivals, "kinds": kinds, "long_requests": kinds.count("long"),
        "max_send_lateness_s": late[0]}


def _closed(cfg, target, cell, rng) -> tuple[list[RequestRecord], dict]:
    """``clients`` threads, each sending its next request when the previous one ends."""
    plan = [[_ask(cfg, cell, rng) for _ in range(cfg.requests_per_client)] for _ in range(cfg.clients)]
    out: list[list[RequestRecord]] = [[] for _ in plan]

    def client(c: int) -> None:
        for a in plan[c]:
            out[c].append(send(target, cfg.endpoint, a, cfg.max_tokens))

    threads = [threading.Thread(target=client, args=(c,), name=f"bench-client-{c}", daemon=True)
               for c in range(cfg.clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return [r for rs in out for r in rs], {"clients": cfg.clients, "requests_per_client": cfg.requests_per_client}


def _agent(cfg, target, cell, rng) -> tuple[list[RequestRecord], dict]:
    """Agent sessions across restarts (``benchmarks.agent_workload.run_phases``), always on the completions
    endpoint: the same raw text reaches both servers, whatever their chat templates (the bundled model is a
    base model; llama-server would apply the GGUF's Gemma template where Hearth applies its transcript one)."""
    from benchmarks import agent_workload

    plan = agent_workload.make_plan(rng, cfg, long_prompt)

    def send_text(prompt: str, kind: str) -> RequestRecord:
        return send(target, "completions", Ask((("user", prompt),), cell.label, kind=kind), cfg.agent_max_tokens)

    records, extra = agent_workload.run_phases(plan, cfg.agent_steps, send_text, target.restart,
                                               lambda: warm_up(cfg, target), cfg.agent_settle_s)
    extra.update(endpoint="completions", max_tokens=cfg.agent_max_tokens, settle_s=cfg.agent_settle_s,
                 preamble_chars=len(plan.preamble), long_prompt_chars=len(plan.long_prompt),
                 memory_after_last_restart=target.memory())
    return records, extra


# -- the run --------------------------------------------------------------------------------------------------
def warm_up(cfg: argparse.Namespace, target: Target) -> RequestRecord:
    """One short request, not measured (connection, first page-in of the weights); raises ``BenchError`` when
    the target fails it, so that a broken setup stops the run before any measurement."""
    rec = send(target, cfg.endpoint, Ask((("user", "Once upon a time"),), "warm-up"), 4)
    if rec.status != "ok":
        raise BenchError(f"the warm-up request to {target.name} ({target.url}) did not succeed: {rec.error}")
    return rec


def restartable(cfg: argparse.Namespace, engine: Any = None) -> bool:
    """Whether every target of this run is a process the benchmark starts (so it can restart it): Hearth as
    ``hearth serve`` (no ``--url``, ``--hearth-server process``, no ``engine``) and no ``--compare`` server."""
    return not cfg.url and not cfg.compare and engine is None and cfg.hearth_server == "process"


def resolve_workloads(cfg: argparse.Namespace, engine: Any = None) -> list[str]:
    """The workloads to run: ``--workloads`` as given, or by default every workload but ``OPT_IN`` (``quote``),
    ``agent`` only when ``restartable``. Raises ``BenchError`` when ``agent`` is asked for on targets it cannot
    restart."""
    names = list(cfg.workloads) if cfg.workloads else [w for w in WORKLOADS if w not in OPT_IN and (
        w not in RESTARTING or restartable(cfg, engine))]
    asked = [w for w in names if w in RESTARTING]
    if asked and not restartable(cfg, engine):
        raise BenchError(f"the {asked[0]} workload restarts the servers, so it needs targets this benchmark starts "
                         "itself: Hearth as `hearth serve` (--hearth-server process, the default; no --url) and "
                         "no --compare server (--peer llama-server is fine)")
    return names


def run(cfg: argparse.Namespace, engine: Any = None) -> dict[str, Any]:
    """Run every workload cell on every target (A/B alternating per round) and return the report dict.
    ``engine``: an already loaded ``Engine`` to serve instead of loading one (used by the tests; implies
    ``--hearth-server thread``). Raises ``BenchError`` (setup) or ``HearthError`` (the model cannot load)."""
    from benchmarks import load_report

    slo = SLO(cfg.slo_ttft_s, cfg.slo_itl_p95_s)
    cfg.workloads = resolve_workloads(cfg, engine)
    runs: list[CellRun] = []
    with open_targets(cfg, engine) as targets:
        for t in targets:
            warm_up(cfg, t)
        started = time.time()
        for rnd in range(cfg.rounds):
            for cell in cells(cfg):
                for t in targets:
                    _progress(f"{cell.label} on {t.name} (round {rnd + 1}/{cfg.rounds})")
                    runs.append(run_cell(cfg, t, cell, rnd))
                    _progress(f"  {_tally(runs[-1].records)}")
        for t in targets:
            t.contract["memory_end_of_run"] = t.memory()
        return load_report.build(cfg, targets, runs, slo, started)


def _tally(records: Sequence[RequestRecord]) -> str:
    from benchmarks.loadstats import counts

    c = counts(records)
    return f"{c['ok']} ok, {c['rejected']} rejected, {c['failed']} failed"


def _progress(msg: str) -> None:
    print(f"load: {msg}", file=sys.stderr, flush=True)


# -- command line ---------------------------------------------------------------------------------------------
def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {s!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {s}")
    return v


def _rates(s: str) -> list[float]:
    """``0.5,1,2`` → [0.5, 1.0, 2.0]; every rate must be > 0 requests/s."""
    parts = [p for p in s.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("expected comma-separated request rates (requests/s), e.g. 0.5,1,2")
    try:
        return [_positive_float(p.strip()) for p in parts]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"every rate must be > 0 requests/s ({e})") from None


def _workloads(s: str) -> list[str]:
    names = [w.strip() for w in s.split(",") if w.strip()]
    bad = [w for w in names if w not in WORKLOADS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown workload {', '.join(bad) or s!r}; choose from "
                                         f"{', '.join(WORKLOADS)}")
    return names


def _float_in(ok, what: str):
    """An argparse type: a float for which ``ok(v)`` holds, else "must be <what>, got '<text>'"."""
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            v = float("nan")
        if not ok(v):
            raise argparse.ArgumentTypeError(f"must be {what}, got {s!r}")
        return v
    return parse


_fraction = _float_in(lambda v: 0.0 <= v <= 1.0, "a fraction in [0, 1]")
_seconds = _float_in(lambda v: 0.0 <= v < float("inf"), "a number of seconds >= 0")


def parser() -> argparse.ArgumentParser:
    from app.cli._engine_args import add_load_args

    p = argparse.ArgumentParser(prog="hearth bench load", description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("targets")
    g.add_argument("--url", default=None, help="benchmark this OpenAI-compatible server instead of starting "
                   "Hearth's (http://host:port, with or without /v1)")
    g.add_argument("--compare", default=None, metavar="URL", help="also run this server, alternating with the "
                   "first target, and print ratios other/first")
    g.add_argument("--hearth-server", choices=("process", "thread"), default="process",
                   help="process (default): Hearth as a `hearth serve` process with a fresh temporary data folder "
                   "(needed by the agent workload's restarts; its memory excludes the client); thread: Hearth's "
                   "server on threads of this process")
    g.add_argument("--peer", choices=("llama-server",), default=None, help="also run llama.cpp's own llama-server "
                   "(built by `make bench-peer`; $HEARTH_LLAMA_SERVER overrides) over the same model file, slots, "
                   "context per slot and threads as the first target, alternating with it, and print ratios "
                   "llama-server/first")
    g.add_argument("--peer-settings", choices=("defaults", "matched"), default="defaults",
                   help="defaults (default): llama-server -m -c -np -t only, everything else at its own "
                   "defaults; matched: also Hearth's n_batch, n_ubatch, flash attention, KV types, swa_full, "
                   "non-unified KV and OpenMP spin policy (like for like)")
    g.add_argument("--ready-timeout-s", type=_positive_float, default=300.0, help="seconds a server the "
                   "benchmark starts may take to answer /health (300)")
    g.add_argument("--served-model", default=None, help="the model field to send to --url/--compare servers "
                   "(default: the first id of GET /v1/models)")
    g.add_argument("--api-key", default=None, help="Authorization: Bearer KEY for --url/--compare servers")
    g.add_argument("--max-queue", type=_positive_int, default=None, help="Hearth's queue bound (default from "
                   "settings: 16); beyond it the server answers 429")
    w = p.add_argument_group("workloads")
    w.add_argument("--workloads", type=_workloads, default=None, help="comma-separated, from "
                   f"{','.join(WORKLOADS)} (default: all but quote; agent only where the benchmark starts the "
                   "servers)")
    w.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="completions",
                   help="completions (default: the same text prefilled on every server) or chat")
    w.add_argument("--max-tokens", type=_positive_int, default=64, help="tokens per answer (default 64)")
    w.add_argument("--rounds", type=_positive_int, default=1, help="repetitions of every workload (default 1)")
    w.add_argument("--seed", type=int, default=0, help="prompt and arrival seed (default 0)")
    w.add_argument("--repeats", type=_positive_int, default=3, help="single: requests back to back (3)")
    w.add_argument("--single-max-tokens", type=_positive_int, default=256, help="single: tokens per answer, "
                   "for decode tokens/s (256)")
    w.add_argument("--long-tokens", type=_positive_int, default=2500, help="long prompts (long, poisson, agent): "
                   "about this many tokens (2500)")
    w.add_argument("--turns", type=_positive_int, default=4, help="multiturn: turns (4)")
    w.add_argument("--think-s", type=_seconds, default=0.5, help="multiturn: wait between turns, s (0.5)")
    w.add_argument("--rates", type=_rates, default=[0.25, 0.5], help="poisson: arrival rates, requests/s, "
                   "comma-separated (0.25,0.5)")
    w.add_argument("--requests", type=_positive_int, default=8, help="poisson: arrivals per rate (8)")
    w.add_argument("--long-fraction", type=_fraction, default=0.25, help="poisson: share of long prompts (0.25)")
    w.add_argument("--clients", type=_positive_int, default=4, help="closed: concurrent clients (4)")
    w.add_argument("--requests-per-client", type=_positive_int, default=2, help="closed: requests each (2)")
    w.add_argument("--agent-steps", type=_positive_int, default=5, help="agent: steps of a session (5)")
    w.add_argument("--agent-more-steps", type=_positive_int, default=2, help="agent: steps added to the first "
                   "session after the second restart (2)")
    w.add_argument("--agent-preamble-tokens", type=_positive_int, default=1500, help="agent: shared preamble, "
                   "tokens (1500)")
    w.add_argument("--agent-step-tokens", type=_positive_int, default=260, help="agent: tokens each step adds to "
                   "the prompt, its answer included (260)")
    w.add_argument("--agent-max-tokens", type=_positive_int, default=64, help="agent: tokens per answer (64)")
    w.add_argument("--agent-settle-s", type=_seconds, default=2.0, help="agent: wait before each restart, "
                   "outside every clock, s (2)")
    w.add_argument("--timeout-s", type=_positive_float, default=600.0, help="per-request read timeout, s (600)")
    s = p.add_argument_group("SLOs and output")
    s.add_argument("--slo-ttft-s", type=_positive_float, default=1.0, help="TTFT objective, s (1.0)")
    s.add_argument("--slo-itl-p95-s", type=_positive_float, default=0.1, help="per-request ITL P95 objective, "
                   "s (0.1)")
    s.add_argument("--out", type=Path, default=None, help="write load.json, load.md and PNG plots here")
    s.add_argument("--json", action="store_true", help="print the whole JSON record instead of the table")
    add_load_args(p)
    return p


def main(argv: Optional[list[str]] = None, engine: Any = None) -> int:
    """Entry point (``hearth bench load ...``): 0 on success, 2 when the benchmark cannot run (one line on
    stderr), 1 when the model cannot load. Bad arguments exit through argparse with its usage message."""
    from app.errors import HearthError
    from benchmarks import load_report

    cfg = parser().parse_args(argv)
    try:
        report = run(cfg, engine=engine)
    except BenchError as e:
        print(f"hearth: error: {e}", file=sys.stderr)
        return 2
    except HearthError as e:
        print(f"hearth: error: {e}", file=sys.stderr)
        return 1
    if cfg.out is not None:
        for path in load_report.write(report, cfg.out):
            _progress(f"wrote {path}")
    print(json.dumps(report, indent=2, default=str) if cfg.json else load_report.markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
