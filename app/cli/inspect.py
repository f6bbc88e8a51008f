"""``hearth inspect [MODEL]``: what a GGUF file is and whether it fits in memory, without loading it.

Reads the header only (``app.catalog.gguf``) and estimates memory (``app.catalog.memory_estimate``) for
the load settings Hearth would use (saved settings overlaid with the flags given). ``n_parallel`` auto is
resolved as the engine resolves it when it loads (``choose_parallel``), and the KV cache is shown per
sequence and in total (each of the n_parallel sequences has its own n_ctx cells). A bad file exits 1 with
one line naming the problem.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from app.cli._engine_args import add_parallel_arg, parallel_override
from app.protocol.types import KV_TYPES, LoadSettings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="show a model's metadata and memory estimate (no loading)",
                       description="Inspect a GGUF model (id from `hearth models`, file name or path; default: "
                                   "the bundled model) and estimate its memory for the given load settings.")
    p.add_argument("model", nargs="?", default=None, help="model id, file name or path")
    p.add_argument("--json", action="store_true", help='print {"model", "memory", "template"} as JSON')
    p.add_argument("--n-ctx", type=int, default=None, help="context window in tokens")
    p.add_argument("--n-ubatch", type=int, default=None, help="physical batch in tokens")
    p.add_argument("--type-k", choices=KV_TYPES, default=None, help="KV cache type for K")
    p.add_argument("--type-v", choices=KV_TYPES, default=None, help="KV cache type for V")
    p.add_argument("--n-gpu-layers", type=int, default=None, help="layers offloaded to the GPU (-1: all)")
    add_parallel_arg(p)
    p.add_argument("--swa-full", dest="swa_full", action="store_true", default=None,
                   help="full-size sliding-window cache (default)")
    p.add_argument("--no-swa-full", dest="swa_full", action="store_false",
                   help="window-only sliding-window cache")
    p.add_argument("--sha256", action="store_true", help="also hash the file (cached)")
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace) -> LoadSettings:
    """Saved load settings (when the settings module is present) overlaid with the flags given."""
    from dataclasses import replace

    try:
        from app.settings import load_user_settings
        base = load_user_settings().load
    except ImportError:
        base = LoadSettings()
    over = {k: getattr(args, k) for k in ("n_ctx", "n_ubatch", "type_k", "type_v", "n_gpu_layers", "swa_full")
            if getattr(args, k, None) is not None}
    over.update(parallel_override(args))
    if over.get("type_v", base.type_v) != "f16":
        over["flash_attn"] = True  # a quantized V cache needs it (as the engine flags do)
    if "n_ubatch" in over and over["n_ubatch"] > base.n_batch:
        over["n_batch"] = over["n_ubatch"]
    return replace(base, **over).validate()


def template_name(info: Any) -> str | None:
    """"gguf" when the file has its own chat template, else the engine's choice (None if unavailable)."""
    if info.chat_template:
        return "gguf"
    try:
        from app.engine.chat.templates import choose_template_name
    except ImportError:
        return None
    return choose_template_name(info)


def run(args: argparse.Namespace) -> int:
    from app.catalog.gguf import inspect_model
    from app.catalog.memory_estimate import available_vram_bytes, estimate_memory
    from app.catalog.registry import resolve_model

    settings = _settings(args)  # bad flags fail before the file is read
    info = inspect_model(resolve_model(args.model), with_sha256=args.sha256)
    auto = settings.n_parallel is None
    from app.catalog.memory_estimate import resolve_parallel

    settings = resolve_parallel(info, settings)
    vram = available_vram_bytes() if settings.n_gpu_layers != 0 else None
    est = estimate_memory(info, settings, available_vram_bytes=vram)
    template = template_name(info)
    if args.json:
        memory = {**est.to_dict(), "n_parallel": settings.n_parallel, "n_parallel_auto": auto}
        print(json.dumps({"model": info.to_dict(), "memory": memory, "template": template},
                         ensure_ascii=False, indent=2))
        return 0
    print("\n".join(_model_lines(info, template) + [""] + _memory_lines(est, settings, auto)))
    return 0


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 20):,.1f} MiB"


def _model_lines(info: Any, template: str | None) -> list[str]:
    heads = f"{info.n_head} heads, {info.n_head_kv} KV heads × {info.head_dim_k}/{info.head_dim_v} dims"
    swa = (f"{info.sliding_window} tokens on {sum(info.swa_layers)}/{info.n_layer} layers"
           if info.sliding_window else "none")
    lines = [
        f"model          {info.id}  ({info.path})",
        f"name           {info.name or '-'}",
        f"architecture   {info.architecture}{'  (embedding model)' if info.is_embedding_model else ''}",
        f"parameters     {info.parameter_count / 1e6:,.1f} M   quantization {info.quantization}",
        f"file           {_mib(info.size_bytes)}, GGUF v{info.gguf_version}, {info.tensor_count} tensors",
        f"layers         {info.n_layer} × {info.n_embd} embd, {heads}",
        f"context        {info.context_length or '?'} tokens trained; sliding window: {swa}",
        f"vocabulary     {info.n_vocab:,} tokens (bos {info.bos_token_id}, eos {info.eos_token_id})",
        f"chat template  {'in the file' if info.chat_template else 'none'}; Hearth uses: {template or '?'}",
    ]
    if info.sha256:
        lines.append(f"sha256         {info.sha256}")
    return lines


def _memory_lines(est: Any, s: LoadSettings, auto: bool = False) -> list[str]:
    """The text of the estimate; ``s.n_parallel`` is resolved (``auto``: it was chosen, not set)."""
    swa = f", SWA layers {est.swa_cells} cells" if est.n_swa_layers else ""
    p = s.n_parallel or 1
    lines = [
        f"memory estimate (n_ctx {s.n_ctx}, n_parallel {p}{' (auto)' if auto else ''}, K {s.type_k}, "
        f"V {s.type_v}, swa_full {s.swa_full}, GPU layers {est.gpu_layers})",
        f"  weights      {_mib(est.weights_bytes)}" + (f" ({_mib(est.weights_gpu_bytes)} on GPU)"
                                                       if est.weights_gpu_bytes else ""),
        f"  KV cache     {_mib(est.kv_bytes)} = {p} sequence{'s' if p != 1 else ''} × {_mib(est.kv_bytes // p)} "
        f"({est.kv_cells} cells{swa} each; {est.kv_bytes_per_token:,} bytes/token)",
        f"  compute      {_mib(est.compute_bytes)}",
        f"  overhead     {_mib(est.overhead_bytes)}",
        f"  total        {_mib(est.total_bytes)}",
        f"  RAM          needs {_mib(est.ram_bytes)}, available {_mib(est.available_ram_bytes)}: "
        f"{est.ram_verdict}",
    ]
    if est.available_vram_bytes is not None:
        lines.append(f"  VRAM         needs {_mib(est.vram_bytes)}, free {_mib(est.available_vram_bytes)}: "
                     f"{est.vram_verdict}")
    lines.append(f"  verdict      {est.verdict}")
    lines += [f"  note: {n}" for n in est.notes]
    return lines
