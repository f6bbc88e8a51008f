"""Engine flags shared by ``generate``, ``chat``, ``serve`` and ``bench`` (load settings + decoding)."""

from __future__ import annotations

import argparse

from app.errors import InvalidRequest
from app.protocol.types import KV_TYPES, MAX_PARALLEL, DecodingParams, LoadSettings

AUTO = "auto"  # --parallel auto: chosen from the memory estimate when the model loads
PARALLEL_HELP = (f"requests served at once (continuous batching; each gets its own n_ctx of KV cache, so the "
                 f"cache is N × n_ctx tokens): 1-{MAX_PARALLEL} or {AUTO} (default from settings: {AUTO}, "
                 "4 where the memory estimate fits, else fewer)")


def add_load_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and engine")
    g.add_argument("--model", "-m", default=None, help="model id (see `hearth models`), file name or path "
                   "(default: the bundled Gemma 3 270M)")
    d = LoadSettings()
    g.add_argument("--n-ctx", type=int, default=None, help=f"context window in tokens (default {d.n_ctx})")
    g.add_argument("--n-batch", type=int, default=None, help=f"prefill chunk in tokens (default {d.n_batch})")
    g.add_argument("--n-ubatch", type=int, default=None, help=f"physical batch in tokens (default {d.n_ubatch})")
    g.add_argument("--n-threads", type=int, default=None, help="CPU threads (default: llama.cpp's choice)")
    g.add_argument("--n-gpu-layers", type=int, default=None, help="layers offloaded to the GPU (-1: all; "
                   "needs a CUDA or Metal build)")
    add_parallel_arg(g)
    g.add_argument("--type-k", choices=KV_TYPES, default=None, help="KV cache type for K (default f16)")
    g.add_argument("--type-v", choices=KV_TYPES, default=None, help="KV cache type for V (default f16; "
                   "q8_0/q4_0 need flash attention)")
    g.add_argument("--flash-attn", dest="flash_attn", action="store_true", default=None,
                   help="flash attention on (default)")
    g.add_argument("--no-flash-attn", dest="flash_attn", action="store_false", help="flash attention off")
    g.add_argument("--no-kv-offload", dest="offload_kqv", action="store_false", default=None,
                   help="keep the KV cache in host RAM even when layers run on the GPU")
    g.add_argument("--no-mmap", dest="use_mmap", action="store_false", default=None, help="read weights into RAM")
    g.add_argument("--mlock", dest="use_mlock", action="store_true", default=None, help="lock weights in RAM")
    g.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false", default=True,
                   help="do not reuse or save KV state on disk")
    g.add_argument("--cache-budget-mb", type=float, default=None,
                   help="byte budget of the on-disk prefix cache in MiB (default from settings: 4096; 0 turns "
                        "the disk cache off)")


def add_parallel_arg(g) -> None:
    """``--parallel N|auto`` on ``g`` (a parser or an argument group); read by ``parallel_override``. Parsed
    there, not by argparse, so a bad value is one ``InvalidRequest`` line like every other load setting."""
    g.add_argument("--parallel", default=None, metavar="N", help=PARALLEL_HELP)


def parallel_override(args: argparse.Namespace) -> dict:
    """``{"n_parallel": N}`` (None for ``auto``) when ``--parallel`` was given, else ``{}``. Raises
    ``InvalidRequest`` naming ``--parallel`` for anything but an integer from 1 to ``MAX_PARALLEL`` or auto."""
    text = getattr(args, "parallel", None)
    if text is None:
        return {}
    if str(text).strip().lower() == AUTO:
        return {"n_parallel": None}
    try:
        n = int(str(text).strip())
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_PARALLEL:
        raise InvalidRequest(f"--parallel must be an integer from 1 to {MAX_PARALLEL} or {AUTO}, got {text!r}",
                             param="n_parallel")
    return {"n_parallel": n}


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    """Decoding flags; each one given overrides the saved default (``decoding`` in settings.json)."""
    g = p.add_argument_group("decoding (defaults: the saved settings)")
    g.add_argument("--max-tokens", type=int, default=None, help="answer length cap in tokens (default 256)")
    g.add_argument("--temperature", "-t", type=float, default=None, help="0 = greedy (default 0.8)")
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--min-p", type=float, default=None)
    g.add_argument("--typical-p", type=float, default=None)
    g.add_argument("--repeat-penalty", type=float, default=None)
    g.add_argument("--presence-penalty", type=float, default=None)
    g.add_argument("--frequency-penalty", type=float, default=None)
    g.add_argument("--seed", type=int, default=None, help="same seed + prompt + settings → same text")
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


LOAD_FLAGS = ("n_ctx", "n_batch", "n_ubatch", "n_threads", "n_gpu_layers", "type_k", "type_v", "flash_attn",
              "offload_kqv", "use_mmap", "use_mlock")


def load_flags(args: argparse.Namespace) -> dict:
    """The ``LoadSettings`` fields the flags given set (``--parallel`` included), for ``app.backends``. Raises
    ``InvalidRequest`` naming ``--parallel`` for a bad value."""
    over = {k: getattr(args, k) for k in LOAD_FLAGS if getattr(args, k, None) is not None}
    over.update(parallel_override(args))
    return over


def load_settings(args: argparse.Namespace, user=None) -> LoadSettings:
    """The base ``LoadSettings`` of every model (``hearth serve``): the saved ``load`` settings (``user``, read
    from the file when None) overlaid with the flags given, through ``app.backends.load_settings`` (no model's
    ``per_model`` entry). Raises ``InvalidRequest`` naming a bad value (``--parallel``, or the field)."""
    from app.backends import load_settings as merged
    from app.settings import load_user_settings

    return merged(user or load_user_settings(), None, load_flags(args))


def decoding(args: argparse.Namespace) -> DecodingParams:
    """The saved decoding defaults overlaid with the flags given; raises ``InvalidRequest`` naming a bad one."""
    from app.settings import load_user_settings

    return load_user_settings().decoding.updated(**{
        k: getattr(args, k) for k in ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty",
                                      "presence_penalty", "frequency_penalty", "seed", "stop", "max_tokens")
        if getattr(args, k, None) is not None})


def make_engine(args: argparse.Namespace):
    """The backend for the model named by ``--model`` (a remote engine's name, an installed model or a path;
    ``app.backends.plan``: the saved settings, the model's ``per_model`` entry, then the flags), loaded. Raises
    ``ModelNotFound``, ``InvalidRequest`` for a bad flag or setting, ``ModelLoadError`` from the load."""
    from app import backends
    from app.settings import load_user_settings

    user = load_user_settings()
    name = getattr(args, "model", None)
    remote = bool(name) and name in user.remotes  # a remote engine (hearth remote add; docs/remote.md)
    p = backends.plan(user, name, flags=None if remote else load_flags(args),
                      prefix_cache=getattr(args, "prefix_cache", True),
                      cache_budget_mb=getattr(args, "cache_budget_mb", None))
    eng = backends.build(p)
    eng.load()
    return eng
