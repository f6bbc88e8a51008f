"""The peer: llama.cpp's own ``llama-server``, built by ``make bench-peer`` from the llama.cpp vendored in the
same llama-cpp-python 0.3.36 sdist, with the same CMAKE_ARGS as Hearth's llama-cpp-python (docs/benchmarks.md,
"The peer"), started here on 127.0.0.1 and a free port so ``hearth bench load`` can measure it next to Hearth.

- ``find_binary()``: ``$HEARTH_LLAMA_SERVER`` if set, else the newest ``llama-server-<key>/llama-server`` under
  ``~/.cache/hearth-peer`` (``$HEARTH_PEER_CACHE``); ``PeerError`` with what to run when there is none.
- ``PeerConfig``: the load settings of a run (model file, slots, context per slot, threads, batch sizes, KV
  types, flash attention, full-size SWA cache) and ``mode``, which of them reach the command line:
  ``defaults`` (llama-server as a person starts it: ``-m MODEL -c <slots × n_ctx> -np <slots> -t <threads>``
  plus host and port, everything else at llama-server's own defaults) or ``matched`` (every setting as
  Hearth's engine has it: like for like). ``PeerConfig.from_load_settings`` takes a Hearth ``LoadSettings``.
  ``command()`` turns it into llama-server's command line.
- ``llama_server(cfg)``: a context manager that starts the server in its own process group
  (``benchmarks.servers.ManagedServer``), waits for ``GET /health`` to answer 200 and, whatever happens, stops
  the whole group on exit (SIGTERM, then SIGKILL).

Run: ``python -m benchmarks.peer [--model M] [--parallel N] [--check]``: serves until Ctrl-C, or with
``--check`` sends one greedy ``/completion`` and prints llama-server's own prefill and decode tokens/s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from benchmarks.servers import ManagedServer, ServerStartError

BINARY_ENV = "HEARTH_LLAMA_SERVER"
CACHE_ENV = "HEARTH_PEER_CACHE"
NAME = "llama-server"
MODES = ("defaults", "matched")
# What llama-server does with what ``defaults`` leaves out, as `llama-server --help` of the pinned build (the
# llama.cpp of llama-cpp-python 0.3.36) states it; for the report, so a reader sees what "defaults" ran with.
DEFAULTS = {"n_batch": 2048, "n_ubatch": 512, "flash_attn": "auto", "type_k": "f16", "type_v": "f16",
            "swa_full": False, "kv_unified": True, "cache_ram_mib": 8192, "ctx_checkpoints": 32,
            "n_gpu_layers": "auto", "threads_batch": "same as -t", "fit": "on (adjusts only unset arguments)",
            "env": "inherited unchanged (the benchmark adds no GOMP_SPINCOUNT)"}


class PeerError(Exception):
    """A known reason the peer cannot run (no binary, it exited, it never became healthy): one line."""


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    return Path(env.get(CACHE_ENV) or Path.home() / ".cache" / "hearth-peer").expanduser()


def find_binary(env: Mapping[str, str] = os.environ) -> Path:
    """The llama-server to run: ``$HEARTH_LLAMA_SERVER``, else the newest ``make bench-peer`` build in the
    cache. Raises ``PeerError`` naming what to do when neither is there."""
    explicit = env.get(BINARY_ENV)
    if explicit:
        p = Path(explicit).expanduser()
        if p.is_file() and os.access(p, os.X_OK):
            return p
        raise PeerError(f"{BINARY_ENV}={explicit} is not an executable file")
    root = cache_dir(env)
    found = sorted((p for p in root.glob(f"{NAME}-*/{NAME}") if p.is_file() and os.access(p, os.X_OK)),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    if found:
        return found[0]
    raise PeerError(f"{NAME} not found in {root}: build it with `make bench-peer` (once per configuration) or "
                    f"set {BINARY_ENV}=/path/to/{NAME}")


@dataclass(frozen=True)
class PeerConfig:
    """llama-server's load settings. ``mode``: ``defaults`` passes only the model, ``-c`` (``n_ctx_per_slot``
    × ``n_parallel``), ``-np`` and ``-t`` (plus host and port; everything else is llama-server's default,
    ``DEFAULTS``); ``matched`` passes every field, as Hearth's engine runs (each of ``n_parallel`` slots gets
    ``n_ctx_per_slot`` tokens of its own KV, non-unified as in Hearth's engine). ``n_threads`` None: Hearth's
    default (``app.childhost.threads.default_threads``). ``extra``: more llama-server arguments, appended."""

    model: Path
    n_parallel: int = 1
    n_ctx_per_slot: int = 4096
    n_threads: Optional[int] = None
    n_batch: int = 256
    n_ubatch: int = 256
    flash_attn: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    swa_full: bool = True
    n_gpu_layers: int = 0
    use_mmap: bool = True
    alias: Optional[str] = None
    extra: tuple[str, ...] = ()
    mode: str = "matched"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"peer settings must be one of {', '.join(MODES)}, got {self.mode!r}")

    @classmethod
    def from_load_settings(cls, model: Any, settings: Any, n_parallel: Optional[int] = None,
                           alias: Optional[str] = None, mode: str = "matched") -> "PeerConfig":
        """The peer over a Hearth engine's settings: ``settings`` is a ``LoadSettings`` (or its dict);
        ``n_parallel`` overrides its (possibly ``None``: auto) slot count, e.g. with the loaded engine's;
        ``mode``: ``defaults`` or ``matched`` (the class docstring)."""
        s = settings if isinstance(settings, Mapping) else asdict(settings)
        return cls(model=Path(model), mode=mode, n_parallel=int(n_parallel or s.get("n_parallel") or 1),
                   n_ctx_per_slot=int(s["n_ctx"]), n_threads=s.get("n_threads"), n_batch=int(s["n_batch"]),
                   n_ubatch=int(s["n_ubatch"]), flash_attn=bool(s["flash_attn"]), type_k=str(s["type_k"]),
                   type_v=str(s["type_v"]), swa_full=bool(s.get("swa_full", True)),
                   n_gpu_layers=int(s.get("n_gpu_layers") or 0), use_mmap=bool(s.get("use_mmap", True)),
                   alias=alias)

    def load_settings(self) -> dict[str, Any]:
        """The settings under Hearth's ``LoadSettings`` names (``n_ctx``: per slot), for a report; in
        ``defaults`` mode the ones not passed are llama-server's defaults (``DEFAULTS``), marked so."""
        if self.mode == "defaults":
            return {"peer_settings": "defaults", "n_ctx": self.n_ctx_per_slot, "n_ctx_total": self.n_ctx_per_slot
                    * self.n_parallel, "n_parallel": self.n_parallel, "n_threads": self.threads(),
                    **{k: f"llama-server default ({v})" for k, v in DEFAULTS.items()}}
        return {"peer_settings": "matched", "n_ctx": self.n_ctx_per_slot, "n_parallel": self.n_parallel,
                "n_batch": self.n_batch,
                "n_ubatch": self.n_ubatch, "n_threads": self.threads(), "n_gpu_layers": self.n_gpu_layers,
                "type_k": self.type_k, "type_v": self.type_v, "flash_attn": self.flash_attn,
                "swa_full": self.swa_full, "use_mmap": self.use_mmap}

    def threads(self) -> int:
        if self.n_threads:
            return int(self.n_threads)
        from app.childhost import default_threads

        return default_threads()


def command(binary: Any, cfg: PeerConfig, port: int, host: str = "127.0.0.1") -> list[str]:
    """llama-server's argv for ``cfg`` on ``host:port``. ``defaults``: exactly ``-m -c -np -t`` and host/port
    (then ``alias`` and ``extra`` when set). ``matched``: also ``--no-kv-unified``, ``-tb``, ``-b``/``-ub``,
    ``-fa``, ``-ctk``/``-ctv``, ``-ngl``, ``--fit off`` (no memory fitting that could change ``-c``),
    ``--no-webui``, ``--swa-full`` and ``--no-mmap`` as set."""
    t = str(cfg.threads())
    if cfg.mode == "defaults":
        argv = [str(binary), "-m", str(cfg.model), "--host", host, "--port", str(port),
                "-c", str(cfg.n_ctx_per_slot * cfg.n_parallel), "-np", str(cfg.n_parallel), "-t", t]
        return argv + (["--alias", cfg.alias] if cfg.alias else []) + list(cfg.extra)
    argv = [str(binary), "-m", str(cfg.model), "--host", host, "--port", str(port),
            "-np", str(cfg.n_parallel), "-c", str(cfg.n_ctx_per_slot * cfg.n_parallel), "--no-kv-unified",
            "-t", t, "-tb", t, "-b", str(cfg.n_batch), "-ub", str(cfg.n_ubatch),
            "-fa", "on" if cfg.flash_attn else "off", "-ctk", cfg.type_k, "-ctv", cfg.type_v,
            "-ngl", str(cfg.n_gpu_layers), "--fit", "off", "--no-webui"]
    if cfg.swa_full:
        argv.append("--swa-full")
    if not cfg.use_mmap:
        argv.append("--no-mmap")
    if cfg.alias:
        argv += ["--alias", cfg.alias]
    return argv + list(cfg.extra)


def peer_env(base: Mapping[str, str] = os.environ, mode: str = "matched") -> dict[str, str]:
    """The environment for the peer: ``base`` unchanged at ``defaults``; at ``matched`` with OpenMP's spin
    count as Hearth's engine sets it for itself (``app.childhost.threads.tune_openmp``: 1000 unless the
    environment sets a policy), so neither side spins more."""
    env = dict(base)
    if mode == "matched" and "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env:
        env["GOMP_SPINCOUNT"] = env.get("HEARTH_GOMP_SPINCOUNT", "1000")
    return env


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class Peer:
    """A running llama-server: its ``url`` (``http://127.0.0.1:PORT``), ``argv``, ``binary``, ``log`` path,
    ``mode`` and the ``ManagedServer`` that owns the process (``server``; ``proc`` is its current process)."""

    url: str
    argv: list[str]
    binary: Path
    log: Path
    server: ManagedServer
    mode: str = "matched"

    @property
    def proc(self) -> subprocess.Popen:
        assert self.server.proc is not None
        return self.server.proc

    def contract(self) -> dict[str, Any]:
        """What the load bench's report records of the peer (besides what it learns over HTTP)."""
        return {"kind": NAME, "binary": str(self.binary), "argv": self.argv, "command": " ".join(self.argv),
                "peer_settings": self.mode, "cmake_args": _cmake_args(self.binary), "log": str(self.log)}


def _cmake_args(binary: Path) -> Optional[str]:
    f = binary.parent / "cmake-args.txt"  # written by `make bench-peer`
    try:
        return f.read_text(encoding="utf-8").strip()
    except OSError:
        return None


@contextlib.contextmanager
def llama_server(cfg: PeerConfig, binary: Any = None, port: Optional[int] = None, host: str = "127.0.0.1",
                 ready_timeout_s: float = 120.0, log_path: Any = None) -> Iterator[Peer]:
    """Start llama-server for ``cfg`` and yield a ``Peer`` once ``/health`` answers 200; stop its process group
    on exit, whatever happens. Its output goes to ``log_path`` (default: a temporary file, kept). Raises
    ``PeerError`` when the binary is missing, the model file is absent, or the server exits or stays unready."""
    binary = Path(binary) if binary else find_binary()
    if not Path(cfg.model).is_file():
        raise PeerError(f"model file not found: {cfg.model}")
    port = port or free_port(host)
    argv = command(binary, cfg, port, host)
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="hearth-peer-", suffix=".log")
        os.close(fd)
        log_path = name
    server = ManagedServer(NAME, argv, f"http://{host}:{port}", log_path, env=peer_env(mode=cfg.mode),
                           ready_timeout_s=ready_timeout_s)
    try:
        server.start()
    except ServerStartError as e:
        raise PeerError(str(e)) from None
    try:
        yield Peer(server.url, argv, binary, server.log, server, cfg.mode)
    finally:
        server.stop()


def check(url: str, prompt: str, n_predict: int) -> dict[str, Any]:
    """One greedy, unstreamed ``POST /completion``; returns llama-server's ``timings`` and the text."""
    body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": False}).encode()
    req = urllib.request.Request(f"{url}/completion", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.loads(r.read())
    return {"wall_s": time.perf_counter() - t0, "timings": answer.get("timings", {}),
            "content": answer.get("content", "")}


# -- command line ---------------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peer", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", "-m", default=None, help="GGUF id, file name or path (default: the bundled model)")
    p.add_argument("--parallel", "-np", type=int, default=1, help="slots (-np, default 1)")
    p.add_argument("--n-ctx", type=int, default=4096, help="context per slot in tokens; -c is this × slots (4096)")
    p.add_argument("--n-threads", type=int, default=None, help="threads (default: Hearth's default)")
    p.add_argument("--peer-settings", choices=MODES, default="defaults", help="defaults (-m -c -np -t only, "
                   "the rest at llama-server's defaults) or matched (the flags below, as Hearth runs)")
    p.add_argument("--n-batch", type=int, default=256, help="matched: -b (256, Hearth's default)")
    p.add_argument("--n-ubatch", type=int, default=256, help="matched: -ub (256, Hearth's default)")
    p.add_argument("--no-flash-attn", dest="flash_attn", action="store_false", help="matched: flash attention off")
    p.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    p.add_argument("--print-command", action="store_true", help="print the command line and exit")
    p.add_argument("--check", action="store_true", help="send one /completion, print tokens/s and exit")
    p.add_argument("--prompt", default="The story of Mara, a baker from a harbour town. One morning",
                   help="--check: the prompt")
    p.add_argument("--n-predict", type=int, default=64, help="--check: tokens to generate (64)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """0 on success, 2 when the peer cannot run, 1 when the model cannot be found (one line on stderr)."""
    from app.catalog.registry import resolve_model
    from app.errors import HearthError

    args = parser().parse_args(argv)
    try:
        model = resolve_model(args.model)
        cfg = PeerConfig(model=model, n_parallel=args.parallel, n_ctx_per_slot=args.n_ctx,
                         n_threads=args.n_threads, n_batch=args.n_batch, n_ubatch=args.n_ubatch,
                         flash_attn=args.flash_attn, mode=args.peer_settings)
        if args.print_command:
            print(" ".join(command(find_binary(), cfg, args.port or 8080)))
            return 0
        with llama_server(cfg, port=args.port) as peer:
            print(f"{NAME} ready on {peer.url} (log {peer.log}): {' '.join(peer.argv)}", file=sys.stderr)
            if args.check:
                r = check(peer.url, args.prompt, args.n_predict)
                t = r["timings"]
                print(f"prompt {t.get('prompt_n')} tokens at {t.get('prompt_per_second', 0):.1f} tokens/s; "
                      f"decode {t.get('predicted_n')} tokens at {t.get('predicted_per_second', 0):.1f} tokens/s; "
                      f"wall {r['wall_s']:.2f} s")
                print(f"text: {r['content']!r}")
                return 0
            try:
                peer.proc.wait()
            except KeyboardInterrupt:
                pass
            return 0
    except PeerError as e:
        print(f"hearth: error: {e}", file=sys.stderr)
        return 2
    except HearthError as e:
        print(f"hearth: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
