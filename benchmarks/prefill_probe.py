"""Raw llama-cpp-python prefill and single-token decode under several batch / SWA layouts, alternating.

For each configuration (n_batch / n_ubatch, ``swa_full``; flash attention on, f16 KV, the engine's threads and
OpenMP setting) a context is loaded once in this process; then, round after round, every configuration in turn:

- prefill: a ~2,500-token prompt (``--prompt-tokens``) evaluated cold in chunks of ``n_batch`` tokens, one
  ``llama_decode`` each, logits for the last token only → prompt tokens / seconds;
- decode: then ``--decode`` single-token ``llama_decode`` calls after that prompt (greedy argmax fed back) →
  the median milliseconds of one call at that depth, and the same after a 40-token prompt (``short``).

``--hearth`` adds the engine's own context shape (``n_parallel`` sequences in a non-unified KV cache, its
defaults) as one more configuration. Reported: medians over rounds. Nothing here is used by the app: it informs
the choice of the prefill layout (docs/engine.md). Run: ``python -m benchmarks.prefill_probe [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

UNIT = ("The history of the lighthouse begins in antiquity, when fires on hilltops guided ships along dangerous "
        "coasts. Keepers wrote down the weather, the ships that passed and the oil they burned each night. ")

CONFIGS = [  # (name, n_batch, n_ubatch, swa_full)
    ("b256/u256 swa_full", 256, 256, True),
    ("b256/u256 swa_win", 256, 256, False),
    ("b512/u512 swa_full", 512, 512, True),
    ("b512/u512 swa_win", 512, 512, False),
    ("b2048/u512 swa_full", 2048, 512, True),
    ("b2048/u512 swa_win", 2048, 512, False),
]


def _settings(n_ctx: int, n_batch: int, n_ubatch: int, swa_full: bool):
    """The probe's load settings: flash attention, f16 KV, the given batch sizes and sliding-window cache."""
    from app.protocol.types import LoadSettings

    return LoadSettings(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, swa_full=swa_full, flash_attn=True,
                        type_k="f16", type_v="f16")


class Ctx:
    """One loaded context with the engine's shape for ``settings`` (``LoadSettings``; ``n_seq`` sequences in a
    non-unified KV cache) and a ``llama_batch`` of its ``n_batch`` tokens."""

    def __init__(self, path: str, settings, n_seq: int = 1) -> None:
        import llama_cpp

        from app.engine.local.llama import _context_with_sequences, llama_kwargs

        kw = llama_kwargs(settings)
        kw["n_ctx"] = settings.n_ctx * n_seq
        with _context_with_sequences(n_seq):
            self.llm = llama_cpp.Llama(model_path=path, **kw)
        n_batch = settings.n_batch
        self.lib, self.n_batch = llama_cpp, n_batch
        self.ctx = self.llm._ctx.ctx
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.n_vocab = self.llm.n_vocab()

    def decode(self, toks: list[int], pos0: int) -> None:
        """One ``llama_decode`` of ``toks`` at positions ``pos0`` … in sequence 0, logits for the last one."""
        b = self.batch
        for i, t in enumerate(toks):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, pos0 + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = i == len(toks) - 1
        b.n_tokens = len(toks)
        if self.lib.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def argmax(self) -> int:
        import numpy as np

        return int(np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,)).argmax())

    def prefill(self, toks: list[int]) -> float:
        """Seconds to evaluate ``toks`` cold, in chunks of ``n_batch``."""
        self.lib.llama_memory_clear(self.mem, True)
        t0 = time.perf_counter()
        for a in range(0, len(toks), self.n_batch):
            self.decode(toks[a:a + self.n_batch], a)
        return time.perf_counter() - t0

    def decode_ms(self, pos: int, n: int) -> float:
        """Median milliseconds of ``n`` single-token decodes after ``pos`` tokens of KV (greedy)."""
        tok, out = self.argmax(), []
        for i in range(n):
            t0 = time.perf_counter()
            self.decode([tok], pos + i)
            tok = self.argmax()
            out.append(time.perf_counter() - t0)
        return statistics.median(out) * 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="GGUF path (default: the bundled model)")
    p.add_argument("--prompt-tokens", type=int, default=2500)
    p.add_argument("--decode", type=int, default=32, help="single-token decodes timed per run")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--hearth", action="store_true", help="also the engine's own context (4 sequences, b256)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    from app.childhost import tune_openmp

    tune_openmp()
    from app.catalog.registry import resolve_model

    path = str(resolve_model(args.model))
    n_ctx = 4096
    ctxs = {name: Ctx(path, _settings(n_ctx, b, u, swa)) for name, b, u, swa in CONFIGS}
    if args.hearth:
        ctxs["hearth (4 seq, b256, swa_full)"] = Ctx(path, _settings(n_ctx, 256, 256, True), n_seq=4)
    first = next(iter(ctxs.values()))
    text = UNIT * (args.prompt_tokens // 30 + 2)
    toks = first.llm.tokenize(text.encode(), add_bos=True, special=False)[:args.prompt_tokens]
    short = toks[:40]
    rows: dict[str, dict[str, list[float]]] = {n: {"prefill_tps": [], "decode_ms": [], "decode_ms_short": []}
                                               for n in ctxs}
    for c in ctxs.values():  # warm-up
        c.prefill(short)
    for _ in range(args.rounds):
        for name, c in ctxs.items():
            rows[name]["prefill_tps"].append(len(toks) / c.prefill(toks))
            rows[name]["decode_ms"].append(c.decode_ms(len(toks), args.decode))
            c.prefill(short)
            rows[name]["decode_ms_short"].append(c.decode_ms(len(short), args.decode))
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in rows.items()}
    if args.json:
        print(json.dumps({"prompt_tokens": len(toks), "median": med, "runs": rows}, indent=1))
        return 0
    print(f"prompt {len(toks)} tokens, {args.rounds} rounds, medians (flash attention on, f16 KV)")
    print(f"{'config':32s} {'prefill tok/s':>14s} {'decode ms @2500':>16s} {'decode ms @40':>14s}")
    for n, m in med.items():
        print(f"{n:32s} {m['prefill_tps']:14.1f} {m['decode_ms']:16.2f} {m['decode_ms_short']:14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
